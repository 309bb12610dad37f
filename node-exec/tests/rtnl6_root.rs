//! Root tests of `kuport_node_exec::rtnl` for IPv6 (issue 19, "Dual-stack"): two namespaces
//! joined by a veth (the IPv4 underlay), each with one of kuport's VXLAN links carrying an IPv4
//! /31 and an IPv6 /127, permanent neighbours of both families at the far end's computed MAC
//! (docs/portmap/links.md), default routes of both families in a kuport table, ip rules of both
//! families and the IPv6 forwarding sysctl. The oracles are `ip -6` and an ICMPv6 echo over
//! the link: IPv6 addresses go on with no duplicate address detection, so the first echo after
//! an apply, or after a hand-deleted link is repaired, is answered. Without root they fail,
//! unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
#[path = "common/notified.rs"]
mod notified;
use notified::notified;
#[path = "common/netns.rs"]
mod netns;
use host::{root, run};
use netns::Netns;

use std::process::Command;

use kuport_node_exec::rtnl::{self, Desired, Subject};
use kuport_proto::v1::{Address, IpRule, Link, Neighbour, NetnsState, Route, Sysctl, Vxlan, link};

const DEV: &str = "kup-6a6b6c6d";
const TABLE: u32 = 201;
const MARK: u32 = 0x6b70_0001;

/// One end of the link: its namespace's underlay address, its link's MAC and its addresses.
struct End {
    underlay: &'static str,
    mac: &'static str,
    v4: &'static str,
    v6: &'static str,
}

const A: End = End { underlay: "10.98.0.1", mac: "02:6b:75:00:00:0a", v4: "169.254.77.2", v6: "fd64:f5ac:e961::2" };
const B: End = End { underlay: "10.98.0.2", mac: "02:6b:75:00:00:0b", v4: "169.254.77.3", v6: "fd64:f5ac:e961::3" };

/// A state like the controller's for one end of a dual-stack link (controller/src/compute/
/// portmap/datapath.rs), with an IPv6 rule that has a destination besides.
fn state(me: &End, peer: &End) -> NetnsState {
    let rule = |pref: u32, to: &str, table: u32, ipv6: bool| IpRule {
        pref,
        fwmark: MARK,
        fwmask: u32::MAX,
        to: to.into(),
        table,
        ipv6,
    };
    NetnsState {
        links: vec![Link {
            name: DEV.into(),
            mtu: 1400,
            kind: Some(link::Kind::Vxlan(Vxlan {
                vni: 4301,
                local: me.underlay.into(),
                remote: peer.underlay.into(),
                dstport: 4790,
                ttl: 64,
            })),
            mac: me.mac.into(),
        }],
        addresses: vec![
            Address { dev: DEV.into(), cidr: format!("{}/31", me.v4) },
            Address { dev: DEV.into(), cidr: format!("{}/127", me.v6) },
        ],
        neighbours: vec![
            Neighbour { dev: DEV.into(), address: peer.v4.into(), mac: peer.mac.into() },
            Neighbour { dev: DEV.into(), address: peer.v6.into(), mac: peer.mac.into() },
        ],
        routes: vec![
            Route { table: TABLE, dst: "default".into(), via: peer.v4.into(), dev: DEV.into() },
            Route { table: TABLE, dst: "default".into(), via: peer.v6.into(), dev: DEV.into() },
        ]
        .into(),
        ip_rules: vec![
            rule(101, &format!("{}/32", peer.underlay), 254, false),
            rule(102, "", TABLE, false),
            rule(101, "2001:db8:77::/64", 254, true),
            rule(102, "", TABLE, true),
        ],
        sysctls: vec![
            Sysctl { key: "net.ipv4.ip_forward".into(), value: "1".into() },
            Sysctl { key: "net.ipv6.conf.all.forwarding".into(), value: "1".into() },
        ],
        ..Default::default()
    }
}

/// The two namespaces, joined by a veth with the underlay's addresses.
fn pair() -> (Netns, Netns) {
    let (a, b) = (Netns::new("rt6", "a"), Netns::new("rt6", "b"));
    a.ip(&["link", "add", "u0", "type", "veth", "peer", "name", "u1", "netns", &b.name]);
    for (ns, dev, end) in [(&a, "u0", &A), (&b, "u1", &B)] {
        ns.ip(&["addr", "add", &format!("{}/24", end.underlay), "dev", dev]);
        ns.ip(&["link", "set", dev, "up"]);
    }
    (a, b)
}

fn apply(ns: &Netns, s: &NetnsState) -> rtnl::ApplyReport {
    rtnl::apply(Some(&ns.path()), s).unwrap_or_else(|e| panic!("apply in {}: {e}", ns.name))
}

fn diff(ns: &Netns, s: &NetnsState) -> Vec<String> {
    let desired = Desired::from_proto(s).expect("valid");
    let observed = rtnl::read(Some(&ns.path()), &desired).expect("read");
    rtnl::diff(&desired, &observed).iter().map(ToString::to_string).collect()
}

fn sysctl(ns: &Netns, key: &str) -> String {
    run("ip", &["netns", "exec", &ns.name, "sysctl", "-n", key]).trim().to_string()
}

/// One ICMPv6 echo request from `ns` to `to` (a raw socket: the kernel sums ICMPv6 itself),
/// answered within 2 s or not. One request only: "the first ping is answered".
const PING6: &str = r#"
import os, socket, struct, sys, time
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
ident = os.getpid() & 0xffff
s.sendto(struct.pack("!BBHHH", 128, 0, 0, ident, 1) + b"kuport", (sys.argv[1], 0))
end = time.time() + 2
while time.time() < end:
    s.settimeout(max(end - time.time(), 0.01))
    try:
        b, peer = s.recvfrom(1500)
    except socket.timeout:
        break
    if len(b) >= 8 and b[0] == 129 and struct.unpack("!H", b[4:6])[0] == ident:
        print("reply from", peer[0])
        sys.exit(0)
print("no reply")
sys.exit(1)
"#;

fn ping6(ns: &Netns, to: &str) -> bool {
    let out =
        Command::new("ip").args(["netns", "exec", &ns.name, "python3", "-c", PING6, to]).output().expect("python3");
    println!("ping6 {} -> {to}: {}", ns.name, String::from_utf8_lossy(&out.stdout).trim());
    out.status.success()
}

/// kuport's rules of one family (`-4` or `-6`) as `ip rule` prints them.
fn kuport_rules(ns: &Netns, family: &str) -> Vec<String> {
    ns.ip(&[family, "rule"]).lines().filter(|l| l.contains("fwmark 0x6b70")).map(str::to_string).collect()
}

/// Everything of `me`'s state is in `ns`, as `ip -6` (and `ip -4` for its twins) lists it.
fn assert_applied(ns: &Netns, me: &End, peer: &End) {
    let addr = ns.ip(&["-6", "-o", "addr", "show", "dev", DEV, "scope", "global"]);
    assert_eq!(addr.lines().count(), 1, "{addr}");
    assert!(addr.contains(&format!("inet6 {}/127 scope global nodad", me.v6)), "{addr}");
    assert!(!addr.contains("tentative"), "{addr}");
    let addr4 = ns.ip(&["-4", "-o", "addr", "show", "dev", DEV]);
    assert!(addr4.contains(&format!("inet {}/31 ", me.v4)), "{addr4}");

    let neigh = ns.ip(&["-6", "neigh", "show", "dev", DEV, "nud", "permanent"]);
    assert_eq!(neigh.trim(), format!("{} lladdr {} PERMANENT", peer.v6, peer.mac), "{neigh}");
    let neigh4 = ns.ip(&["-4", "neigh", "show", "dev", DEV, "nud", "permanent"]);
    assert_eq!(neigh4.trim(), format!("{} lladdr {} PERMANENT", peer.v4, peer.mac), "{neigh4}");

    let route = ns.ip(&["-6", "route", "show", "table", &TABLE.to_string()]);
    assert_eq!(route.trim(), format!("default via {} dev {DEV} metric 1024 pref medium", peer.v6), "{route}");
    let route4 = ns.ip(&["-4", "route", "show", "table", &TABLE.to_string()]);
    assert_eq!(route4.trim(), format!("default via {} dev {DEV}", peer.v4), "{route4}");

    // `ip rule` omits a full mask.
    assert_eq!(
        kuport_rules(ns, "-6"),
        [
            "101:\tfrom all to 2001:db8:77::/64 fwmark 0x6b700001 lookup main",
            "102:\tfrom all fwmark 0x6b700001 lookup 201",
        ]
    );
    assert_eq!(
        kuport_rules(ns, "-4"),
        [
            format!("101:\tfrom all to {} fwmark 0x6b700001 lookup main", peer.underlay),
            "102:\tfrom all fwmark 0x6b700001 lookup 201".to_string(),
        ]
    );
    assert_eq!(sysctl(ns, "net.ipv6.conf.all.forwarding"), "1");
}

#[test]
fn a_dual_stack_link_carries_ipv6_at_once_and_after_a_repair() {
    if !root() {
        return;
    }
    let (a, b) = pair();
    // New links in a inherit disable_ipv6 = 1: kuport enables IPv6 on its own link.
    run("ip", &["netns", "exec", &a.name, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"]);
    let (sa, sb) = (state(&A, &B), state(&B, &A));

    let report = apply(&a, &sa);
    println!("{report}");
    // link, 2 sysctls, disable_ipv6, 2 addresses, 2 neighbours, 2 routes, 4 rules.
    assert_eq!(report.writes, 14, "{report}");
    assert!(
        report.actions.iter().any(|x| x == &format!("set sysctl net/ipv6/conf/{DEV}/disable_ipv6 = 0")),
        "{report}"
    );
    let report = apply(&b, &sb);
    assert_eq!(report.writes, 13, "{report}");
    assert_applied(&a, &A, &B);
    assert_applied(&b, &B, &A);
    assert_eq!(diff(&a, &sa), Vec::<String>::new());
    assert_eq!(diff(&b, &sb), Vec::<String>::new());
    // No neighbour discovery and no DAD wait: the first echo each way is answered.
    assert!(ping6(&a, B.v6), "the first echo a -> b over IPv6 went unanswered");
    assert!(ping6(&b, A.v6), "the first echo b -> a over IPv6 went unanswered");
    assert_eq!(apply(&a, &sa).writes, 0);
    assert_eq!(apply(&b, &sb).writes, 0);

    // An operator deletes the link: it comes back with its MAC, both addresses, both
    // neighbours and both routes (the rules did not go with it), and carries IPv6 at once.
    a.ip(&["link", "del", DEV]);
    assert!(!diff(&a, &sa).is_empty());
    let report = apply(&a, &sa);
    println!("{report}");
    // link, disable_ipv6 again, 2 addresses, 2 neighbours, 2 routes.
    assert_eq!(report.writes, 8, "{report}");
    assert_applied(&a, &A, &B);
    assert!(ping6(&a, B.v6), "the first echo after the repair went unanswered");
    assert!(ping6(&b, A.v6), "the first echo to the repaired end went unanswered");
    assert_eq!(diff(&a, &sa), Vec::<String>::new());

    // A hand-deleted IPv6 rule is drift, noticed and named; the IPv4 twin is left alone.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut sub = rtnl::subscribe(Some(&a.path())).expect("subscribe");
    a.ip(&["-6", "rule", "del", "pref", "102"]);
    assert!(notified(&rt, &mut sub, Subject::Rule), "the IPv6 rule's deletion went unnoticed");
    assert_eq!(diff(&a, &sa), ["missing rule -6 pref 102 fwmark 0x6b700001/0xffffffff lookup 201"]);
    assert_eq!(apply(&a, &sa).writes, 1);
    assert_applied(&a, &A, &B);

    // A hand-deleted IPv6 route and neighbour are drift too.
    sub.drain();
    a.ip(&["-6", "route", "del", "default", "table", &TABLE.to_string()]);
    assert!(notified(&rt, &mut sub, Subject::Route), "the IPv6 route's deletion went unnoticed");
    a.ip(&["-6", "neigh", "del", B.v6, "dev", DEV]);
    assert_eq!(
        diff(&a, &sa),
        [
            format!("missing neighbour {} lladdr {} dev {DEV}", B.v6, B.mac),
            format!("missing route default via {} dev {DEV} table 201", B.v6),
        ]
    );
    assert_eq!(apply(&a, &sa).writes, 2);
    assert_applied(&a, &A, &B);
}

#[test]
fn ipv6_objects_no_longer_desired_go_and_foreign_ones_stay() {
    if !root() {
        return;
    }
    let (a, _b) = pair();
    // Someone else's IPv6 objects: a route in main, a rule at kuport's preference with another
    // mark, and the kernel's own link-local address on kuport's link.
    a.ip(&["-6", "addr", "add", "2001:db8:5::1/64", "dev", "u0", "nodad"]);
    a.ip(&["-6", "route", "add", "2001:db8:6::/64", "via", "2001:db8:5::2", "dev", "u0"]);
    a.ip(&["-6", "rule", "add", "pref", "101", "fwmark", "0x1234", "lookup", "main"]);
    let s = state(&A, &B);
    apply(&a, &s);
    // The kernel gives the link an fe80:: address of its own: never extra.
    assert!(a.ip(&["-6", "addr", "show", "dev", DEV]).contains("inet6 fe80::"));
    assert_eq!(diff(&a, &s), Vec::<String>::new());

    // Only the IPv6 half desired: the IPv4 twins go, the IPv6 objects stay.
    let mut v6 = s.clone();
    v6.addresses.retain(|x| x.cidr.contains(':'));
    v6.neighbours.retain(|x| x.address.contains(':'));
    v6.routes.retain(|x| x.via.contains(':'));
    v6.ip_rules.retain(|x| x.ipv6);
    let report = apply(&a, &v6);
    println!("{report}");
    // 2 rules, 1 route, 1 neighbour, 1 address.
    assert_eq!(report.writes, 5, "{report}");
    assert_eq!(kuport_rules(&a, "-4"), Vec::<String>::new());
    assert_eq!(kuport_rules(&a, "-6").len(), 2);
    assert!(a.ip(&["-4", "route", "show", "table", "201"]).trim().is_empty());
    assert!(!a.ip(&["-6", "route", "show", "table", "201"]).trim().is_empty());

    let report = apply(&a, &NetnsState::default());
    println!("{report}");
    // 2 rules, 1 route, 1 neighbour, 1 address, the link; sysctls are never reverted.
    assert_eq!(report.writes, 6, "{report}");
    assert_eq!(kuport_rules(&a, "-6"), Vec::<String>::new());
    assert!(a.ip(&["-6", "route", "show", "table", "201"]).trim().is_empty());
    assert!(a.ip(&["-6", "route", "show"]).contains("2001:db8:6::/64 via 2001:db8:5::2 dev u0"));
    assert!(a.ip(&["-6", "rule"]).contains("101:\tfrom all fwmark 0x1234 lookup main"));
    assert!(a.ip(&["-6", "addr", "show", "dev", "u0"]).contains("2001:db8:5::1/64"));
    assert_eq!(diff(&a, &NetnsState::default()), Vec::<String>::new());
}

#[test]
fn an_ipv6_address_on_a_link_without_ipv6_names_the_link() {
    if !root() {
        return;
    }
    let (a, _b) = pair();
    let mut s = state(&A, &B);
    // An address on a link whose MTU IPv6 cannot run on (below 1280): the kernel has no IPv6
    // on it, and the refusal names the address.
    s.links[0].mtu = 1200;
    s.neighbours.retain(|n| !n.address.contains(':'));
    s.routes.retain(|r| !r.via.contains(':'));
    let err = rtnl::apply(Some(&a.path()), &s).expect_err("no IPv6 below 1280");
    let text = err.to_string();
    println!("{text}");
    assert!(text.contains(&format!("address {}/127 dev {DEV}", A.v6)), "{text}");
    // The IPv4 half is in place all the same.
    assert!(a.ip(&["-4", "-o", "addr", "show", "dev", DEV]).contains(&format!("inet {}/31 ", A.v4)));
}

#[test]
fn the_ipv6_forwarding_sysctl_is_set_in_the_namespace_only() {
    if !root() {
        return;
    }
    let (a, _b) = pair();
    let host = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/forwarding").expect("host");
    run("ip", &["netns", "exec", &a.name, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=0"]);
    let s = NetnsState {
        sysctls: vec![Sysctl { key: "net.ipv6.conf.all.forwarding".into(), value: "1".into() }],
        ..Default::default()
    };
    assert_eq!(diff(&a, &s), ["changed sysctl net.ipv6.conf.all.forwarding: 0 -> 1"]);
    assert_eq!(apply(&a, &s).writes, 1);
    assert_eq!(sysctl(&a, "net.ipv6.conf.all.forwarding"), "1");
    assert_eq!(std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/forwarding").expect("host"), host);
}
