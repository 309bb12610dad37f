//! Root tests of `kuport_node_exec::rtnl` against a real kernel, each in a scratch namespace.
//! The oracle is `ip`. Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
#[path = "common/notified.rs"]
mod notified;
use host::{root, run};
use notified::notified;

use std::{
    path::PathBuf,
    process::Command,
    sync::atomic::{AtomicUsize, Ordering},
};

use kuport_node_exec::rtnl::{self, Change, Desired, Subject};
use kuport_proto::v1::{Address, IpRule, Link, Neighbour, NetnsState, Route, Sysctl, Vxlan, link};

const DEV: &str = "kup-1234abcd";
const UNDERLAY: &str = "10.99.0.1";
const PEER: &str = "10.99.0.2";

/// A scratch network namespace, deleted on drop (also when the test fails).
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!("kuport-rt-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
        run("ip", &["netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        // The VXLAN underlay address lives on lo: there are no dummy links on the CI kernel.
        ns.ip(&["addr", "add", &format!("{UNDERLAY}/32"), "dev", "lo"]);
        ns
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.name))
    }

    fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    fn try_ip(&self, args: &[&str]) -> bool {
        Command::new("ip").args(["-n", &self.name]).args(args).status().is_ok_and(|s| s.success())
    }

    fn sysctl(&self, key: &str) -> String {
        run("ip", &["netns", "exec", &self.name, "sysctl", "-n", key]).trim().to_string()
    }

    fn ifindex(&self, dev: &str) -> String {
        let out = self.ip(&["-o", "link", "show", dev]);
        out.split(':').next().unwrap_or_default().to_string()
    }

    /// Foreign objects kuport must never touch: a veth pair with a route, and a rule at kuport's
    /// preference 101 with someone else's mark.
    fn add_foreign(&self) {
        self.ip(&["link", "add", "fx0", "type", "veth", "peer", "name", "fx1"]);
        self.ip(&["link", "set", "fx0", "up"]);
        self.ip(&["link", "set", "fx1", "up"]);
        self.ip(&["addr", "add", "10.123.0.1/24", "dev", "fx0"]);
        self.ip(&["route", "add", "10.124.0.0/16", "via", "10.123.0.2", "dev", "fx0"]);
        self.ip(&["rule", "add", "pref", "101", "fwmark", "0x1234", "lookup", "main"]);
    }

    fn assert_foreign(&self) {
        assert!(self.ip(&["link", "show", "fx0"]).contains("fx0"));
        assert!(self.ip(&["route", "show"]).contains("10.124.0.0/16 via 10.123.0.2 dev fx0"));
        assert!(self.ip(&["rule"]).contains("101:\tfrom all fwmark 0x1234 lookup main"));
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

struct Want {
    remote: &'static str,
    mtu: u32,
    vni: u32,
    via: &'static str,
    forward: &'static str,
}

impl Default for Want {
    fn default() -> Self {
        Want { remote: PEER, mtu: 1370, vni: 4201, via: "169.254.77.3", forward: "1" }
    }
}

fn state(w: &Want) -> NetnsState {
    NetnsState {
        links: vec![Link {
            name: DEV.into(),
            mtu: w.mtu,
            kind: Some(link::Kind::Vxlan(Vxlan {
                vni: w.vni,
                local: UNDERLAY.into(),
                remote: w.remote.into(),
                dstport: 4790,
                ttl: 64,
            })),
            mac: String::new(),
        }],
        addresses: vec![Address { dev: DEV.into(), cidr: "169.254.77.2/31".into() }],
        routes: vec![Route { table: 201, dst: "default".into(), via: w.via.into(), dev: DEV.into() }].into(),
        ip_rules: vec![
            IpRule {
                pref: 101,
                fwmark: 0x6b70_0001,
                fwmask: 0xffff_ffff,
                to: "100.64.0.2/32".into(),
                table: 254,
                ipv6: false,
            },
            IpRule { pref: 102, fwmark: 0x6b70_0001, fwmask: 0xffff_ffff, to: String::new(), table: 201, ipv6: false },
        ],
        sysctls: vec![
            Sysctl { key: "net.ipv4.ip_forward".into(), value: w.forward.into() },
            Sysctl { key: format!("net.ipv4.conf.{DEV}.rp_filter"), value: "2".into() },
        ],
        ..Default::default()
    }
}

fn apply(ns: &Netns, s: &NetnsState) -> rtnl::ApplyReport {
    let path = ns.path();
    rtnl::apply(Some(&path), s).unwrap_or_else(|e| panic!("apply: {e}"))
}

fn diff(ns: &Netns, s: &NetnsState) -> Vec<rtnl::Difference> {
    let desired = Desired::from_proto(s).expect("valid");
    let path = ns.path();
    let observed = rtnl::read(Some(&path), &desired).expect("read");
    rtnl::diff(&desired, &observed)
}

/// kuport's rules (mark under 0x6b70....) as `ip rule` prints them.
fn kuport_rules(ns: &Netns) -> Vec<String> {
    ns.ip(&["rule"]).lines().filter(|l| l.contains("fwmark 0x6b70")).map(str::to_string).collect()
}

fn assert_applied(ns: &Netns, w: &Want) {
    let link = ns.ip(&["-d", "link", "show", DEV]);
    assert!(link.contains(&format!("mtu {}", w.mtu)), "{link}");
    assert!(link.contains(",UP"), "{link}");
    assert!(link.contains(&format!("vxlan id {} remote {} local {UNDERLAY} ", w.vni, w.remote)), "{link}");
    assert!(link.contains("dstport 4790 ttl 64 "), "{link}");
    let addr = ns.ip(&["-4", "-o", "addr", "show", "dev", DEV]);
    assert_eq!(addr.lines().count(), 1, "{addr}");
    assert!(addr.contains("inet 169.254.77.2/31 "), "{addr}");
    // `ip rule` omits a full mask and a /32.
    assert_eq!(
        kuport_rules(ns),
        ["101:\tfrom all to 100.64.0.2 fwmark 0x6b700001 lookup main", "102:\tfrom all fwmark 0x6b700001 lookup 201",]
    );
    assert_eq!(ns.ip(&["route", "show", "table", "201"]).trim(), format!("default via {} dev {DEV}", w.via));
    assert_eq!(ns.sysctl("net.ipv4.ip_forward"), w.forward);
    assert_eq!(ns.sysctl(&format!("net.ipv4.conf.{DEV}.rp_filter")), "2");
}

#[test]
fn apply_from_empty_then_reapply_writes_nothing() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    ns.add_foreign();
    // Desire the opposite of the namespace's forwarding, to see the sysctl land there only.
    let before = ns.sysctl("net.ipv4.ip_forward");
    let host_before = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").expect("host");
    let want = Want { forward: if before == "1" { "0" } else { "1" }, ..Want::default() };
    let s = state(&want);

    let report = apply(&ns, &s);
    println!("{report}");
    // link, 2 sysctls, address, route, 2 rules.
    assert_eq!(report.writes, 7, "{report}");
    assert_applied(&ns, &want);
    ns.assert_foreign();
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").expect("host"),
        host_before,
        "the host namespace's sysctl changed"
    );
    assert_eq!(diff(&ns, &s), []);

    let again = apply(&ns, &s);
    assert_eq!(again.writes, 0, "{again}");
    assert_applied(&ns, &want);
}

#[test]
fn peer_change_is_in_place() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    apply(&ns, &state(&Want::default()));
    let index = ns.ifindex(DEV);

    let want = Want { remote: "10.99.0.3", ..Want::default() };
    let d = diff(&ns, &state(&want));
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].object, format!("link {DEV}"));
    assert_eq!(d[0].change, Change::Changed("remote 10.99.0.2 -> 10.99.0.3".into()));

    let report = apply(&ns, &state(&want));
    assert_eq!(report.writes, 1, "{report}");
    assert_eq!(ns.ifindex(DEV), index, "the link was recreated");
    assert_applied(&ns, &want);
}

#[test]
fn mtu_change_is_in_place() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    apply(&ns, &state(&Want::default()));
    let index = ns.ifindex(DEV);

    let want = Want { mtu: 1400, ..Want::default() };
    let report = apply(&ns, &state(&want));
    assert_eq!(report.writes, 1, "{report}");
    assert_eq!(ns.ifindex(DEV), index, "the link was recreated");
    assert_applied(&ns, &want);
}

#[test]
fn vni_change_recreates_and_restores_dependents() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    apply(&ns, &state(&Want::default()));

    // The kernel refuses a new VNI in place ("Cannot change VNI"): delete, create, and the
    // address, route and per-link sysctl that went with the old link come back.
    let want = Want { vni: 4202, ..Want::default() };
    let report = apply(&ns, &state(&want));
    assert_eq!(report.writes, 5, "{report}");
    assert_applied(&ns, &want);
    assert_eq!(apply(&ns, &state(&want)).writes, 0);
}

#[test]
fn removing_everything_leaves_no_trace_and_spares_foreign_objects() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    ns.add_foreign();
    apply(&ns, &state(&Want::default()));

    let report = apply(&ns, &NetnsState::default());
    // 2 rules, 1 route, 1 address, 1 link; sysctls are never reverted.
    assert_eq!(report.writes, 5, "{report}");
    let order: Vec<&str> = report.actions.iter().map(|a| a.split_whitespace().nth(1).unwrap_or_default()).collect();
    assert_eq!(order, ["rule", "rule", "route", "address", "link"]);

    assert!(!ns.try_ip(&["link", "show", DEV]), "{DEV} survived");
    assert_eq!(kuport_rules(&ns), Vec::<String>::new());
    assert_eq!(ns.ip(&["route", "show", "table", "201"]).trim(), "");
    ns.assert_foreign();
    assert_eq!(diff(&ns, &NetnsState::default()), []);
}

#[test]
fn outside_changes_are_noticed_and_repaired() {
    if !root() {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let ns = Netns::new();
    let want = Want::default();
    let s = state(&want);
    apply(&ns, &s);
    let path = ns.path();
    let mut sub = rtnl::subscribe(Some(&path)).expect("subscribe");

    ns.ip(&["rule", "del", "pref", "102"]);
    assert!(notified(&rt, &mut sub, Subject::Rule), "rule deletion unnoticed");
    let d = diff(&ns, &s);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].change, Change::Missing);
    assert!(d[0].object.starts_with("rule pref 102 "), "{}", d[0].object);
    assert_eq!(apply(&ns, &s).writes, 1);
    assert_applied(&ns, &want);

    sub.drain();
    ns.ip(&["link", "del", DEV]);
    assert!(notified(&rt, &mut sub, Subject::Link), "link deletion unnoticed");
    assert!(!diff(&ns, &s).is_empty());
    // link, per-link sysctl, address, route.
    assert_eq!(apply(&ns, &s).writes, 4);
    assert_applied(&ns, &want);
    assert_eq!(diff(&ns, &s), []);
}

const MAC: &str = "02:6b:75:00:00:01";
const PEER_MAC: &str = "02:6b:75:00:00:02";

/// The link at a computed MAC with a permanent entry for the far end (docs/portmap/links.md).
fn state_with_neighbour() -> NetnsState {
    let mut s = state(&Want::default());
    s.links[0].mac = MAC.into();
    s.neighbours = vec![Neighbour { dev: DEV.into(), address: "169.254.77.3".into(), mac: PEER_MAC.into() }];
    s
}

fn assert_mac_and_neighbour(ns: &Netns) {
    let link = ns.ip(&["-d", "link", "show", DEV]);
    assert!(link.contains(&format!("link/ether {MAC} ")), "{link}");
    let neigh = ns.ip(&["-4", "neigh", "show", "nud", "permanent"]);
    assert_eq!(neigh.trim(), format!("169.254.77.3 dev {DEV} lladdr {PEER_MAC} PERMANENT"), "{neigh}");
}

#[test]
fn link_mac_and_permanent_neighbour_are_applied_and_repaired() {
    if !root() {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let ns = Netns::new();
    let s = state_with_neighbour();
    let report = apply(&ns, &s);
    // link, 2 sysctls, address, neighbour, route, 2 rules.
    assert_eq!(report.writes, 8, "{report}");
    assert_mac_and_neighbour(&ns);
    assert_applied(&ns, &Want::default());
    assert_eq!(diff(&ns, &s), []);
    assert_eq!(apply(&ns, &s).writes, 0);

    let path = ns.path();
    let mut sub = rtnl::subscribe(Some(&path)).expect("subscribe");
    // A learned entry for another address on kuport's link is the kernel's: never extra.
    ns.ip(&["neigh", "add", "169.254.77.9", "lladdr", "02:00:00:00:00:09", "dev", DEV, "nud", "stale"]);
    ns.ip(&["neigh", "del", "169.254.77.3", "dev", DEV]);
    assert!(notified(&rt, &mut sub, Subject::Neighbour), "neighbour deletion unnoticed");
    let d: Vec<String> = diff(&ns, &s).iter().map(ToString::to_string).collect();
    assert_eq!(d, [format!("missing neighbour 169.254.77.3 lladdr {PEER_MAC} dev {DEV}")]);
    assert_eq!(apply(&ns, &s).writes, 1);
    assert_mac_and_neighbour(&ns);

    // Another MAC, and the entry made a learned one: both repaired in place.
    let index = ns.ifindex(DEV);
    ns.ip(&["link", "set", "dev", DEV, "address", "02:aa:bb:cc:dd:ee"]);
    ns.ip(&["neigh", "replace", "169.254.77.3", "lladdr", "02:00:00:00:00:07", "dev", DEV, "nud", "reachable"]);
    let d: Vec<String> = diff(&ns, &s).iter().map(ToString::to_string).collect();
    assert_eq!(
        d,
        [
            format!("changed link {DEV}: address 02:aa:bb:cc:dd:ee -> {MAC}"),
            format!(
                "changed neighbour 169.254.77.3 lladdr {PEER_MAC} dev {DEV}: \
                 lladdr 02:00:00:00:00:07 -> {PEER_MAC}, nud reachable -> permanent"
            ),
        ]
    );
    assert_eq!(apply(&ns, &s).writes, 2);
    assert_eq!(ns.ifindex(DEV), index, "the link was recreated, not changed in place");
    assert_mac_and_neighbour(&ns);
    assert_eq!(diff(&ns, &s), []);

    // A deleted link comes back with its MAC and its neighbour.
    ns.ip(&["link", "del", DEV]);
    apply(&ns, &s);
    assert_mac_and_neighbour(&ns);

    // A neighbour no longer desired goes; the link keeps its MAC.
    let mut without = s.clone();
    without.neighbours.clear();
    let report = apply(&ns, &without);
    assert_eq!(report.writes, 1, "{report}");
    assert!(ns.ip(&["-4", "neigh", "show", "nud", "permanent"]).trim().is_empty());
}

#[test]
fn refused_changes_report_the_object_and_keep_the_previous_state() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let want = Want::default();
    apply(&ns, &state(&want));
    let path = ns.path();

    // A gateway no address of the link reaches: replacing the route fails, the old one stays.
    let unreachable = state(&Want { via: "10.200.0.1", ..Want::default() });
    let err = rtnl::apply(Some(&path), &unreachable).expect_err("unreachable gateway");
    let text = err.to_string();
    println!("{text}");
    assert!(text.contains(&format!("change route default via 10.200.0.1 dev {DEV} table 201: ")), "{text}");
    assert!(text.contains("Nexthop has invalid gateway"), "{text}");
    assert_applied(&ns, &want);

    // A name the kernel refuses (longer than 15 bytes), replacing the old link: nothing old is
    // removed because the new one failed.
    let mut long = state(&want);
    let name = "kup-0123456789abcdef";
    long.links[0].name = name.into();
    long.addresses[0].dev = name.into();
    long.routes[0].dev = name.into();
    long.sysctls.truncate(1);
    let err = rtnl::apply(Some(&path), &long).expect_err("long name");
    let text = err.to_string();
    println!("{text}");
    assert!(text.contains(&format!("add link {name}: ")), "{text}");
    assert!(err.errors[0].errno().is_some(), "{text}");
    assert_applied(&ns, &want);
    assert_eq!(apply(&ns, &state(&want)).writes, 0);
}

#[test]
fn invalid_states_write_nothing() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    let path = ns.path();
    let mut s = state(&Want::default());
    s.ip_rules[0].fwmark = 0x1234;
    s.ip_rules[0].fwmask = 0xffff_ffff;
    let err = rtnl::apply(Some(&path), &s).expect_err("foreign mark");
    assert_eq!(err.report.writes, 0);
    assert!(err.to_string().contains("rule pref 101 fwmark 0x1234/"), "{err}");
    assert!(!ns.try_ip(&["link", "show", DEV]));
}
