//! One simulated overlay member for the overlay root tests: its state directory, its
//! WireGuard (wireguard-go in a private mount namespace whose `/var/run/wireguard` is the
//! member's own folder, as on a real node), and its wiring to the underlay and to its pod.
#![allow(dead_code)] // each test uses part of it

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use kuport_controller::observe::KnownFacts;
use kuport_node_exec::executor::{Executor, Report};
use kuport_node_exec::wireguard::{Options, Wireguard};
use kuport_proto::v1::NetnsState;

use super::host::run;
use super::netns::Netns;
use super::wg_dump::Dump;

/// A directory removed on drop.
pub struct Dir(pub PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Dir {
    /// wireguard-go's socket folder for this member.
    pub fn sockets(&self) -> PathBuf {
        self.0.join("sockets")
    }
}

/// The underlay: a bridge `br0` in a namespace of its own, `{net}.0/24` of `mtu` on every
/// member. `prefix` names the test's namespaces and folders.
pub struct Underlay {
    pub ns: Netns,
    prefix: &'static str,
    net: &'static str,
    mtu: u32,
}

impl Underlay {
    pub fn new(prefix: &'static str, net: &'static str, mtu: u32) -> Self {
        let ns = Netns::new(prefix, "ul");
        ns.ip(&["link", "add", "br0", "type", "bridge"]);
        ns.ip(&["link", "set", "br0", "up"]);
        Underlay { ns, prefix, net, mtu }
    }

    /// Member `index` called `name`, its folder named by `run` too (unique within the test
    /// binary). With `verbose`, wireguard-go logs each packet it drops, into the member's log.
    pub fn member(&self, run: &str, (index, name): (u8, &'static str), verbose: bool) -> Member {
        let prefix = self.prefix;
        let dir = Dir(std::env::temp_dir().join(format!("kuport-{prefix}-{}-{run}-{name}", std::process::id())));
        let log = dir.0.join("wireguard-go.log");
        let wg = wireguard(&dir, verbose.then_some(log.as_path()));
        let member = Member {
            name,
            index,
            pod: Netns::new(prefix, &format!("{name}-pod")),
            ns: Netns::new(prefix, name),
            dir,
            wg,
            underlay: format!("{}.{index}", self.net),
            mtu: self.mtu,
        };
        plug(&self.ns, &member.ns, &member.pod, index, &member.underlay, self.mtu);
        member
    }
}

/// One member: its namespace, its pod's, its state directory (key, sockets, the wrapper, the
/// daemon's log) and its WireGuard. Fields drop in order: pod, node (its daemon), directory.
pub struct Member {
    pub name: &'static str,
    pub index: u8,
    pub pod: Netns,
    pub ns: Netns,
    pub dir: Dir,
    pub wg: Arc<Wireguard>,
    underlay: String,
    mtu: u32,
}

impl Member {
    pub fn sockets(&self) -> PathBuf {
        self.dir.sockets()
    }

    /// What wireguard-go wrote (with `verbose`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("wireguard-go.log")).unwrap_or_default()
    }

    pub fn key(&self) -> String {
        self.wg.public_key().to_string()
    }

    pub fn executor(&self) -> Executor {
        Executor::new(Some(self.ns.path())).with_wireguard(Arc::clone(&self.wg))
    }

    pub fn underlay(&self) -> String {
        self.underlay.clone()
    }

    pub fn pod_cidr(&self) -> String {
        format!("10.42.{}.0/24", self.index)
    }

    pub fn pod_v4(&self) -> String {
        format!("10.42.{}.2", self.index)
    }

    /// The overlay address the controller derives: the first address of the IPv4 pod CIDR.
    pub fn overlay(&self) -> String {
        format!("10.42.{}.0", self.index)
    }

    /// What its executor reports: its public key and underlay MTU.
    pub fn facts(&self) -> KnownFacts {
        KnownFacts {
            node: self.name.into(),
            underlay_address: None,
            underlay_mtu: Some(self.mtu),
            interfaces: None,
            wireguard_public_key: Some(self.key()),
            ..Default::default()
        }
    }

    /// Runs `wg ARGS` inside the member's namespace with its own wireguard-go folder mounted
    /// where `wg` looks (`ip netns exec` gives it a mount namespace of its own).
    fn wg_output(&self, args: &str) -> Output {
        let script = format!("mount --bind {} /var/run/wireguard && exec wg {args}", self.sockets().display());
        self.ns.command(&["sh", "-c", &script]).output().expect("wg")
    }

    /// `wg ARGS` on the member's own daemon; panics when it fails.
    pub fn wg(&self, args: &str) {
        let out = self.wg_output(args);
        assert!(out.status.success(), "{}: wg {args}: {}", self.name, String::from_utf8_lossy(&out.stderr));
    }

    pub fn dump(&self, dev: &str) -> Dump {
        Dump::parse(&self.wg_output(&format!("show {dev} dump")), self.name)
    }
}

/// The member's WireGuard, its key in `dir`. The executor starts wireguard-go through a wrapper
/// that gives the daemon `dir`'s socket folder as `/var/run/wireguard` (and talks to the
/// sockets there: `Options::socket_dir`). With `log`, the daemon is verbose and its output goes
/// to that file.
fn wireguard(dir: &Dir, log: Option<&Path>) -> Arc<Wireguard> {
    let sockets = dir.sockets();
    std::fs::create_dir_all(&sockets).expect("socket folder");
    let (verbose, redirect) = match log {
        Some(log) => ("export LOG_LEVEL=verbose\n", format!(" >>{} 2>&1", log.display())),
        None => ("", String::new()),
    };
    let wrapper = dir.0.join("wireguard-go");
    let script = format!(
        "#!/bin/sh\n{verbose}exec unshare --mount --propagation private sh -c 'mkdir -p /var/run/wireguard && mount --bind \"$0\" /var/run/wireguard && exec wireguard-go \"$@\"' {} \"$@\"{redirect}\n",
        sockets.display()
    );
    std::fs::write(&wrapper, script).expect("wrapper");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let options = Options { wireguard_go: wrapper, socket_dir: sockets, ..Options::default() };
    Arc::new(Wireguard::load(&dir.0, options).expect("the node's key"))
}

/// Wires member `index` (namespace `ns`) to the underlay's bridge `br0` (`eth0` on the member,
/// `n{index}` on the bridge, both of `mtu`, the member at `address`/24) and its pod `pod` to it
/// as the bridge CNI with host-local IPAM would: `pod0` on the member with `10.42.{index}.1/24`,
/// `eth0` in the pod with `.2` and the member as its default route.
fn plug(underlay: &Netns, ns: &Netns, pod: &Netns, index: u8, address: &str, mtu: u32) {
    let port = format!("n{index}");
    run(
        "ip",
        &["link", "add", "eth0", "netns", &ns.name, "type", "veth", "peer", "name", &port, "netns", &underlay.name],
    );
    underlay.ip(&["link", "set", &port, "master", "br0", "mtu", &mtu.to_string(), "up"]);
    ns.ip(&["link", "set", "eth0", "mtu", &mtu.to_string(), "up"]);
    ns.ip(&["addr", "add", &format!("{address}/24"), "dev", "eth0"]);
    run("ip", &["link", "add", "pod0", "netns", &ns.name, "type", "veth", "peer", "name", "eth0", "netns", &pod.name]);
    let i = index;
    ns.ip(&["addr", "add", &format!("10.42.{i}.1/24"), "dev", "pod0"]);
    ns.ip(&["link", "set", "pod0", "up"]);
    pod.ip(&["addr", "add", &format!("10.42.{i}.2/24"), "dev", "eth0"]);
    pod.ip(&["link", "set", "eth0", "up"]);
    pod.ip(&["route", "add", "default", "via", &format!("10.42.{i}.1")]);
}

impl Netns {
    /// The packets counted by the rule containing `what` in `nft list table FAMILY NAME`.
    pub fn counted(&self, family: &str, table: &str, what: &str) -> u64 {
        let listing = self.nft(&["list", "table", family, table]);
        let line = listing.lines().find(|l| l.contains(what)).unwrap_or_else(|| panic!("no {what:?} in\n{listing}"));
        let packets = line.split("counter packets ").nth(1).and_then(|r| r.split_whitespace().next());
        packets.and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("no counter in {line:?}"))
    }

    /// Deletes the one rule of the overlay's forward chain whose listing contains `what`.
    pub fn delete_forward_rule(&self, what: &str) {
        use kuport_controller::compute::overlay::{FORWARD_CHAIN, NFT_TABLE};
        let listing = self.nft(&["-a", "list", "chain", "inet", NFT_TABLE, FORWARD_CHAIN]);
        let lines: Vec<&str> = listing.lines().filter(|l| l.contains(what) && l.contains("# handle ")).collect();
        assert_eq!(lines.len(), 1, "{}: one rule with {what:?} in\n{listing}", self.name);
        let handle = lines[0].rsplit("# handle ").next().expect("a handle").trim();
        self.nft(&["delete", "rule", "inet", NFT_TABLE, FORWARD_CHAIN, "handle", handle]);
    }
}

pub fn apply(ex: &mut Executor, s: &NetnsState) -> Report {
    ex.apply(s).unwrap_or_else(|e| panic!("apply: {e}"))
}
