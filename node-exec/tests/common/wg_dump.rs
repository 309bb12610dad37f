//! `wg show DEV dump` (wireguard-tools, the oracle) parsed, for root tests (node-exec's and the
//! lab's `e2e/tests/overlay_root.rs`).
#![allow(dead_code)] // each test uses part of it

use std::collections::BTreeSet;

/// `wg show dump`: [private key, public key, port, fwmark]; per peer [public key, preshared,
/// endpoint, allowed ips, latest handshake, rx, tx, keepalive].
#[derive(Debug)]
pub struct Dump {
    pub device: Vec<String>,
    pub peers: Vec<Vec<String>>,
}

impl Dump {
    /// Parses the output of a successful `wg show DEV dump`; `what` names it in the panic.
    pub fn parse(out: &std::process::Output, what: &str) -> Dump {
        assert!(out.status.success(), "wg show on {what}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = text.lines();
        let device: Vec<String> = lines.next().unwrap_or_default().split('\t').map(String::from).collect();
        let peers = lines.map(|l| l.split('\t').map(String::from).collect()).collect();
        Dump { device, peers }
    }

    pub fn peer(&self, key: &str) -> Option<&Vec<String>> {
        self.peers.iter().find(|p| p[0] == key)
    }

    pub fn handshake(&self, key: &str) -> u64 {
        self.peer(key).map_or(0, |p| p[4].parse().unwrap_or(0))
    }

    pub fn rx(&self, key: &str) -> u64 {
        self.peer(key).map_or(0, |p| p[5].parse().unwrap_or(0))
    }

    /// (received, transmitted) bytes.
    pub fn bytes(&self, key: &str) -> (u64, u64) {
        self.peer(key).map_or((0, 0), |p| (p[5].parse().unwrap_or(0), p[6].parse().unwrap_or(0)))
    }

    pub fn keys(&self) -> BTreeSet<String> {
        self.peers.iter().map(|p| p[0].clone()).collect()
    }

    /// (public key, endpoint, allowed IPs sorted, keepalive) per peer.
    pub fn peer_set(&self) -> BTreeSet<(String, String, String, String)> {
        self.peers.iter().map(|p| (p[0].clone(), p[2].clone(), sorted(&p[3]), p[7].clone())).collect()
    }
}

/// A comma-separated list, sorted.
pub fn sorted(list: &str) -> String {
    let mut v: Vec<&str> = list.split(',').filter(|s| !s.is_empty()).collect();
    v.sort();
    v.join(",")
}
