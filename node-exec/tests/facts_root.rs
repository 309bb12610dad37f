//! Root tests of the executor's facts (docs/portmap/datapath.md, "The request claim";
//! docs/portmap/links.md, "UDP port"): in a scratch namespace shaped like a node of each CNI, the
//! facts name the device of every pod route and the CNI's VXLAN ports, never kuport's own, and
//! a new pod route is announced on the subscription the executor re-reads its facts on; each
//! interface lists its IPv4 addresses, then its global IPv6 ones, never a link-local fe80::. They
//! fail when not run as root unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
use host::{root, run};

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use kuport_node_exec::rtnl::{self, Subject};
use kuport_node_exec::sync::facts;

struct Netns(String);

impl Netns {
    fn new() -> Self {
        Self::named("")
    }
    /// One per test: the tests of this binary run in parallel.
    fn named(suffix: &str) -> Self {
        let name = format!("kuport-facts-{}{suffix}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        run("ip", &["netns", "add", &name]);
        Netns(name)
    }
    fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.0)
    }
    fn ip(&self, args: &[&str]) {
        let mut a = vec!["-n", self.0.as_str()];
        a.extend_from_slice(args);
        run("ip", &a);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn routes(ns: &Netns) -> Vec<(String, String)> {
    let f = facts::read(Some(&ns.path()), Some("eth0")).expect("facts");
    f.routes.into_iter().map(|r| (r.dst, r.dev)).collect()
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

#[test]
fn facts_name_each_pod_routes_device_and_the_cnis_vxlan_ports() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    // The underlay, with a default route and a route to another node's pods through it.
    ns.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "eth0x"]);
    ns.ip(&["addr", "add", "100.64.0.12/24", "dev", "eth0"]);
    ns.ip(&["link", "set", "eth0x", "up"]);
    ns.ip(&["link", "set", "eth0", "up"]);
    ns.ip(&["route", "add", "default", "via", "100.64.0.1", "dev", "eth0"]);
    ns.ip(&["route", "add", "10.244.3.0/24", "via", "100.64.0.13", "dev", "eth0"]);
    // Calico-like: a pod's /32 on its own veth.
    ns.ip(&["link", "add", "cali1b2c3d4e5f6", "type", "veth", "peer", "name", "eth0p"]);
    ns.ip(&["link", "set", "cali1b2c3d4e5f6", "up"]);
    ns.ip(&["route", "add", "10.244.2.107/32", "dev", "cali1b2c3d4e5f6"]);
    // A bridge's /24 (the kernel's route for its address).
    ns.ip(&["link", "add", "cni0", "type", "bridge"]);
    ns.ip(&["addr", "add", "10.244.9.1/24", "dev", "cni0"]);
    ns.ip(&["link", "set", "cni0", "up"]);
    // The CNI's VXLAN devices, and one of kuport's (left out, with its /31).
    ns.ip(&["link", "add", "flannel.1", "type", "vxlan", "id", "1", "dstport", "8472", "local", "100.64.0.12"]);
    ns.ip(&["link", "add", "vxlan.calico", "type", "vxlan", "id", "4096", "dstport", "4789", "local", "100.64.0.12"]);
    ns.ip(&["link", "add", "kup-dcc4266d", "type", "vxlan", "id", "4201", "dstport", "4790", "local", "100.64.0.12"]);
    ns.ip(&["addr", "add", "169.254.77.3/31", "dev", "kup-dcc4266d"]);
    ns.ip(&["link", "set", "kup-dcc4266d", "up"]);

    let f = facts::read(Some(&ns.path()), Some("eth0")).expect("facts");
    assert_eq!(f.vxlan_ports, [4789, 8472]);
    let got: Vec<(String, String)> = f.routes.into_iter().map(|r| (r.dst, r.dev)).collect();
    assert_eq!(
        got,
        [pair("10.244.2.107/32", "cali1b2c3d4e5f6"), pair("10.244.9.0/24", "cni0"), pair("100.64.0.0/24", "eth0")],
        "no default route, no route through the underlay's gateway, nothing on kup-"
    );

    // A new pod: its route is announced, and the re-read facts hold it.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut sub = rtnl::subscribe(Some(&ns.path())).expect("subscribe");
    ns.ip(&["route", "add", "10.244.2.108/32", "dev", "cali1b2c3d4e5f6"]);
    let noticed = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(n) = sub.recv().await {
                if n.subject == Subject::Route {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false)
    });
    assert!(noticed, "a new pod route is not announced");
    assert!(routes(&ns).contains(&pair("10.244.2.108/32", "cali1b2c3d4e5f6")));
}

#[test]
fn facts_list_ipv4_then_global_ipv6_addresses_and_no_link_local() {
    if !root() {
        return;
    }
    let ns = Netns::named("-v6");
    ns.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "eth0x"]);
    ns.ip(&["link", "set", "eth0x", "up"]);
    ns.ip(&["link", "set", "eth0", "up"]);
    ns.ip(&["addr", "add", "100.64.0.12/24", "dev", "eth0"]);
    ns.ip(&["addr", "add", "100.64.0.9/24", "dev", "eth0"]);
    ns.ip(&["-6", "addr", "add", "2001:db8:1::12/64", "dev", "eth0", "nodad"]);
    ns.ip(&["-6", "addr", "add", "fd00:1::12/64", "dev", "eth0", "nodad"]);
    // A link-local address besides the kernel's own: neither is reported.
    ns.ip(&["-6", "addr", "add", "fe80::12/64", "dev", "eth0", "nodad"]);
    ns.ip(&["route", "add", "default", "via", "100.64.0.1", "dev", "eth0"]);
    // An IPv6 default route elsewhere does not move the underlay.
    ns.ip(&["link", "add", "eth1", "type", "veth", "peer", "name", "eth1x"]);
    ns.ip(&["link", "set", "eth1x", "up"]);
    ns.ip(&["link", "set", "eth1", "up"]);
    ns.ip(&["-6", "addr", "add", "2001:db8:2::12/64", "dev", "eth1", "nodad"]);
    ns.ip(&["-6", "route", "add", "default", "via", "2001:db8:2::1", "dev", "eth1", "metric", "1"]);

    let f = facts::read(Some(&ns.path()), None).expect("facts");
    let eth0 = f.interfaces.iter().find(|i| i.name == "eth0").expect("eth0");
    assert_eq!(eth0.addresses, ["100.64.0.12", "100.64.0.9", "2001:db8:1::12", "fd00:1::12"]);
    let eth1 = f.interfaces.iter().find(|i| i.name == "eth1").expect("eth1");
    assert_eq!(eth1.addresses, ["2001:db8:2::12"]);
    assert_eq!((f.underlay_interface.as_str(), f.underlay_address.as_str()), ("eth0", "100.64.0.12"));
    assert!(f.routes.iter().all(|r| !r.dst.contains(':')), "{:?}", f.routes);
}
