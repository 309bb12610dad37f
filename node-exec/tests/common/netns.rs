//! A scratch network namespace for the WireGuard root tests: made with loopback up, and on drop
//! its processes (wireguard-go daemons outlive their executor) ended by pid and it deleted.
#![allow(dead_code)] // each test uses part of it

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::host::{remove_netns, run};

pub struct Netns {
    pub name: String,
}

impl Netns {
    /// `kuport-PREFIX-PID-N[-what]`: unique across the test binary's threads.
    pub fn new(prefix: &str, what: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let suffix = if what.is_empty() { String::new() } else { format!("-{what}") };
        let name = format!("kuport-{prefix}-{}-{n}{suffix}", std::process::id());
        run("ip", &["netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.name))
    }

    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// `nft ARGS` in the namespace (the oracle, and the hand that deletes a rule for an ablation).
    pub fn nft(&self, args: &[&str]) -> String {
        let mut all = vec!["netns", "exec", &self.name, "nft"];
        all.extend_from_slice(args);
        run("ip", &all)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        remove_netns(&self.name);
    }
}
