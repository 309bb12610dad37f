//! Root test of the relay's filter (docs/overlay/filter.md, docs/overlay/relays.md, issue 17):
//! a relay forwards only between WireGuard peers and only between pod addresses, and each rule
//! of its forward chain earns its place by an ablation.
//!
//! Three members on a shared underlay (a bridge in its own namespace): `home-a` and `home-b`,
//! and `cloud`, a relay candidate (labelled control-plane). home-a reports home-b unreachable,
//! so the controller's `compute` relays the pair through cloud: home-a's entry for cloud holds
//! cloud's and home-b's pod CIDRs, and its entry for home-b only home-b's overlay /32 (and
//! likewise on home-b). Each node's executor applies its computed host namespace (its own
//! codec writes cloud's table) and runs wireguard-go in a private mount namespace whose
//! `/var/run/wireguard` is the node's own folder, with `LOG_LEVEL=verbose` and its output in a
//! log file (an oracle: wireguard-go names each packet it drops for its source). Each node has
//! a pod (a namespace on a veth, `.2` of its pod CIDR). `ext` stands for the networks behind
//! the members that are no part of the cluster: one link to cloud (172.30.0.0/24) and one to
//! home-b (172.31.0.0/24), with an echo server and a counter per link.
//!
//! Oracles: `nft list table inet kuport-overlay` (the rules' counters), test-only tables outside
//! kuport's prefix that count what a namespace sees, `wg show dump`, wireguard-go's log, and
//! echo servers (tests/data/overlay_echo.py) that answer with the source address they saw.
//! Without root it fails, unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
#[path = "common/netns.rs"]
mod netns;
use netns::Netns;
#[path = "common/echo.rs"]
mod echo;
#[path = "common/member.rs"]
mod member;
#[path = "common/wg_dump.rs"]
mod wg_dump;
use echo::{ECHO_PORT, Proc, script, serve, until};
use host::{root, run};
use member::{Member, Underlay, apply};
use wg_dump::sorted;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kuport_controller::compute::overlay::{NFT_TABLE, OverlaySettings};
use kuport_controller::compute::{Settings, compute, testkit};
use kuport_controller::observe::{Cluster, ObservedPeer};
use kuport_node_exec::executor::Executor;
use kuport_proto::v1::{NetnsState, Reach};

const UNDERLAY_MTU: u32 = 1460;
const LISTEN_PORT: u16 = 51820;
/// The port the spoofed datagrams go to (nothing listens: only counters see them).
const SPOOF_PORT: u16 = 7799;
/// Sends COUNT datagrams of SIZE bytes from a socket bound to SOURCE to HOST:PORT, and waits
/// for nothing.
const SPOOF: &str = "import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
for _ in range(int(sys.argv[5])):
    s.sendto(b'x' * int(sys.argv[4]), (sys.argv[2], int(sys.argv[3])))
";
/// Addresses outside the cluster that home-a puts on its own loopback to send from.
const OUTSIDE_SOURCE: &str = "192.0.2.77";
/// An address in home-b's pod CIDR that is no pod: home-a pretending to be home-b.
const IMPERSONATED_SOURCE: &str = "10.42.3.77";
/// Behind cloud and behind home-b, on ext.
const EXT_BEHIND_CLOUD: &str = "172.30.0.9";
const EXT_BEHIND_HOME_B: &str = "172.31.0.9";

impl Netns {
    /// A test-only table `ip seen` (outside kuport's prefix: the executor leaves it alone) with
    /// one chain on `hook` that counts each of `rules`.
    fn counters(&self, hook: &str, rules: &[String]) {
        self.nft(&["add", "table", "ip", "seen"]);
        let spec = format!("{{ type filter hook {hook} priority -300; }}");
        self.nft(&["add", "chain", "ip", "seen", hook, &spec]);
        for r in rules {
            self.nft(&["add", "rule", "ip", "seen", hook, r, "counter"]);
        }
    }
}

/// One member (tests/common/member.rs), with what this test asks of it.
type Node = Member;

impl Member {
    /// The packets counted by the rule of the overlay's table that contains `what`.
    fn counted(&self, what: &str) -> u64 {
        self.ns.counted("inet", NFT_TABLE, what)
    }

    /// Deletes the one rule of the overlay's forward chain whose listing contains `what`.
    fn delete_rule(&self, what: &str) {
        self.ns.delete_forward_rule(what)
    }
}

struct Lab {
    nodes: Vec<Node>,
    ext: Netns,
    _underlay: Underlay,
}

impl Lab {
    fn new(dev: &str) -> Self {
        let underlay = Underlay::new("rf", "192.168.78", UNDERLAY_MTU);
        let ext = Netns::new("rf", "ext");
        // wireguard-go verbose: its log names each packet it drops.
        let nodes = [(1u8, "home-a"), (2, "cloud"), (3, "home-b")]
            .into_iter()
            .map(|member| underlay.member(dev, member, true))
            .collect::<Vec<_>>();
        // ext: a network behind cloud and one behind home-b, which the members route to and
        // the cluster does not hold. Its answers go back through the member they came from.
        for (node, net, link) in [(&nodes[1], "172.30.0", "to-cloud"), (&nodes[2], "172.31.0", "to-home-b")] {
            run(
                "ip",
                &[
                    "link",
                    "add",
                    "lan0",
                    "netns",
                    &node.ns.name,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    link,
                    "netns",
                    &ext.name,
                ],
            );
            node.ns.ip(&["addr", "add", &format!("{net}.1/24"), "dev", "lan0"]);
            node.ns.ip(&["link", "set", "lan0", "up"]);
            ext.ip(&["addr", "add", &format!("{net}.9/24"), "dev", link]);
            ext.ip(&["link", "set", link, "up"]);
        }
        ext.ip(&["route", "add", "10.42.1.2/32", "via", "172.30.0.1"]);
        ext.ip(&["route", "add", "10.42.1.0/32", "via", "172.31.0.1"]);
        ext.counters(
            "input",
            &[
                format!("iifname \"to-cloud\" udp dport {ECHO_PORT}"),
                format!("iifname \"to-home-b\" udp dport {ECHO_PORT}"),
            ],
        );
        Lab { nodes, ext, _underlay: underlay }
    }

    fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).expect("node")
    }

    /// The cluster the controller sees: the three Nodes (cloud labelled control-plane), each
    /// executor's facts, and home-a's report that home-b is unreachable.
    fn cluster(&self) -> Cluster {
        let mut c = Cluster { now: testkit::now(), ..Default::default() };
        for n in &self.nodes {
            let labels = if n.name == "cloud" {
                serde_json::json!({"node-role.kubernetes.io/control-plane": ""})
            } else {
                serde_json::json!({})
            };
            let node = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": n.name, "labels": labels},
                "spec": {"podCIDRs": [n.pod_cidr()]},
                "status": {"addresses": [{"type": "InternalIP", "address": n.underlay()}]},
            });
            c.nodes.push(serde_json::from_value(node).expect("a Node"));
            c.facts.push(n.facts());
        }
        let unreachable = ObservedPeer { reach: Reach::Unreachable, ..Default::default() };
        std::sync::Arc::make_mut(c.overlay_observed.reports.entry("home-a".into()).or_default())
            .insert(self.node("home-b").key(), unreachable);
        c
    }
}

/// A datagram of 100 bytes from `ns` to `to`'s echo server, up to three tries of 1 s: "echo
/// SOURCE-AS-SEEN 100" or "lost".
fn ping(ns: &Netns, to: &str) -> String {
    script(ns, &["df", to, &ECHO_PORT.to_string(), "100"])
}

/// `count` datagrams of 500 bytes from `ns`, sent from `source` (an address of `ns`).
fn spoof(ns: &Netns, source: &str, to: &str, count: u32) {
    let out = ns
        .command(&["python3", "-c", SPOOF, source, to, &SPOOF_PORT.to_string(), "500", &count.to_string()])
        .output()
        .expect("python3");
    assert!(out.status.success(), "spoof: {}", String::from_utf8_lossy(&out.stderr));
}

/// A relayed pair's pods talk through the relay, and nothing else gets through it; each rule of
/// the relay's forward chain, deleted by hand, lets the failure it prevents appear (and the
/// executor's re-apply puts it back):
///
/// - the accept: home-a's pod reaches home-b's pod both ways (UDP and TCP) through cloud, and
///   the accept's counter on cloud rises; without it, the datagrams stop at cloud, counted by
///   the drop after it;
/// - a spoofed source from home-a (outside the cluster, or inside home-b's pod CIDR) dies in
///   cloud's WireGuard (its log names the disallowed source; it never appears on cloud's
///   device), with or without the drops;
/// - the overlay-to-overlay drop: with cloud's WireGuard made to accept the outside source
///   from home-a (a hand-widened entry), the drop stops it at cloud; without the drop cloud
///   sends it on to home-b, whose WireGuard then drops it;
/// - the drop of what arrives for an address outside the members' pod CIDRs: home-a, a rogue
///   member, routes an address behind cloud through its entry for cloud. With the drop it ends
///   at cloud, counted; without it (the table before this rule) cloud forwards it into its own
///   network and the answer comes back to home-a's pod: an open forwarder. Pod traffic to
///   cloud's own pod and home-a's host to cloud's overlay address (local delivery, as port
///   maps' VXLAN links over the overlay) keep working with it.
#[test]
fn a_relay_forwards_only_between_pod_addresses_and_each_rule_earns_its_place() {
    if !root() {
        return;
    }
    let started = Instant::now();
    let dev = format!("kup-r{}", std::process::id() % 100_000);
    let lab = Lab::new(&dev);
    let (a, r, b) = (lab.node("home-a"), lab.node("cloud"), lab.node("home-b"));
    let settings = Settings { overlay: Some(OverlaySettings::new(&dev, LISTEN_PORT).expect("overlay")) };
    let out = compute(&lab.cluster(), &settings);
    assert_eq!(out.overlay["home-a"].routes["home-b"].to_string(), "via cloud");
    assert!(out.overlay["cloud"].relay);
    let states: BTreeMap<&str, NetnsState> = lab
        .nodes
        .iter()
        .map(|n| {
            let s = out.node_states[n.name].netns.iter().find(|ns| ns.target.is_none()).cloned().expect("host");
            (n.name, s)
        })
        .collect();
    let mut exs: BTreeMap<&str, Executor> = BTreeMap::new();
    for n in &lab.nodes {
        let mut ex = n.executor();
        apply(&mut ex, &states[n.name]);
        exs.insert(n.name, ex);
    }
    // The relayed entries, as docs/overlay/relays.md says.
    let allowed = |on: &Node, peer: &Node| on.dump(&dev).peer(&peer.key()).map(|p| sorted(&p[3])).expect("a peer");
    assert_eq!(allowed(a, r), sorted(&format!("{},{}", r.pod_cidr(), b.pod_cidr())));
    assert_eq!(allowed(a, b), format!("{}/32", b.overlay()));
    assert_eq!(allowed(b, r), sorted(&format!("{},{}", r.pod_cidr(), a.pod_cidr())));
    assert_eq!(allowed(r, a), a.pod_cidr());
    // Cloud's table, written by the executor's codec, lists as the controller renders it.
    let table = |n: &Node| n.ns.nft(&["-s", "list", "table", "inet", NFT_TABLE]);
    let want = kuport_proto::text::nft_table(&states["cloud"].nft_tables[0]);
    assert_eq!(table(r), want);
    assert_eq!(apply(&mut r.executor(), &states["cloud"]).writes, 0, "a re-apply writes nothing");
    println!("cloud's table:\n{want}");

    let relayed = "ip saddr @pods_v4 ip daddr @pods_v4";
    // How the rules are found in a listing with counters.
    let hairpin = format!("oifname \"{dev}\" counter");
    let outside = "ip daddr != @pods_v4";
    let _servers: Vec<Proc> = [&a.pod, &b.pod, &r.pod, &r.ns, &lab.ext].into_iter().map(serve).collect();

    // Positive: pod to pod through the relay, both ways, UDP and TCP; cloud's accept counts it.
    let before = r.counted(relayed);
    for (from, to) in [(a, b), (b, a)] {
        let want = format!("udp {} 6\ntcp {} 20000", from.pod_v4(), from.pod_v4());
        until(&format!("{} -> {} through cloud", from.name, to.name), Duration::from_secs(15), || {
            (script(&from.pod, &["client", &to.pod_v4(), &ECHO_PORT.to_string(), "20000"]) == want).then_some(())
        });
    }
    let after = r.counted(relayed);
    assert!(after >= before + 20, "cloud's relay rule counted the pods' packets: {before} -> {after}");
    assert_eq!(b.dump(&dev).handshake(&a.key()), 0, "no direct session between the homes");
    // Local delivery is untouched by the drops: home-a's pod to cloud's pod (forwarded to a
    // local pod), home-a's host to cloud's overlay address (input, as a VXLAN link over it).
    assert_eq!(ping(&a.pod, &r.pod_v4()), format!("echo {} 100", a.pod_v4()));
    assert_eq!(ping(&a.ns, &r.overlay()), format!("echo {} 100", a.overlay()));
    assert_eq!((r.counted(&hairpin), r.counted(outside)), (0, 0), "no legitimate packet dropped");
    println!("MEASURE relayed: cloud's accept counted {} packets for the pods' UDP and TCP both ways", after - before);

    // Ablation of the accept: home-a's datagrams stop at cloud, counted by the drop.
    r.delete_rule(relayed);
    let dropped = r.counted(&hairpin);
    assert_eq!(ping(&a.pod, &b.pod_v4()), "lost");
    let now = r.counted(&hairpin);
    assert!(now >= dropped + 3, "cloud's drop counted the 3 datagrams: {dropped} -> {now}");
    println!("MEASURE without the accept: 3 datagrams lost, cloud's drop {dropped} -> {now}");
    apply(&mut r.executor(), &states["cloud"]);
    assert_eq!(table(r), want, "the executor put the accept back");
    until("home-a's pod reaches home-b's pod again", Duration::from_secs(10), || {
        (ping(&a.pod, &b.pod_v4()) == format!("echo {} 100", a.pod_v4())).then_some(())
    });

    // Spoofed sources from home-a, to home-b's pod over home-a's entry for cloud (which allows
    // that destination). Counters: on cloud, what comes out of its WireGuard with them and what
    // it sends on; on home-b, anything with them.
    for s in [OUTSIDE_SOURCE, IMPERSONATED_SOURCE] {
        a.ns.ip(&["addr", "add", &format!("{s}/32"), "dev", "lo"]);
    }
    let spoofed = format!("ip saddr {{ {OUTSIDE_SOURCE}, {IMPERSONATED_SOURCE} }}");
    r.ns.counters("prerouting", &[format!("iifname \"{dev}\" {spoofed}")]);
    r.ns.counters("postrouting", &[format!("oifname \"{dev}\" {spoofed}")]);
    b.ns.counters("prerouting", std::slice::from_ref(&spoofed));
    // Their listings (nft sorts the set).
    let (into_cloud, out_of_cloud, spoofed) =
        (format!("iifname \"{dev}\" ip saddr"), format!("oifname \"{dev}\" ip saddr"), "ip saddr".to_string());
    let seen = |n: &Node, what: &str| n.ns.counted("ip", "seen", what);
    let disallowed = |n: &Node| n.log().matches("IPv4 packet with disallowed source address").count();
    // With every rule, then with both drops deleted: WireGuard drops them at cloud either way.
    for drops in [true, false] {
        if !drops {
            r.delete_rule(&hairpin);
            r.delete_rule(outside);
        }
        let (rx, logged) = (r.dump(&dev).rx(&a.key()), disallowed(r));
        for s in [OUTSIDE_SOURCE, IMPERSONATED_SOURCE] {
            spoof(&a.ns, s, &b.pod_v4(), 5);
        }
        let logged = until("cloud's wireguard-go logs the 10 spoofed datagrams", Duration::from_secs(5), || {
            let now = disallowed(r);
            (now >= logged + 10).then_some(now - logged)
        });
        std::thread::sleep(Duration::from_millis(300));
        let rx = r.dump(&dev).rx(&a.key()) - rx;
        assert!(rx >= 10 * 500, "cloud received and decrypted them from home-a: {rx} bytes");
        assert_eq!(seen(r, &into_cloud), 0, "nothing came out of cloud's WireGuard with a spoofed source");
        assert_eq!((seen(r, &out_of_cloud), seen(b, &spoofed)), (0, 0));
        println!(
            "MEASURE spoofed sources ({}): 10 sent, cloud's WireGuard got {rx} bytes from home-a and logged {logged} \
             disallowed sources, 0 on cloud's device, 0 at home-b",
            if drops { "every rule" } else { "drops deleted" }
        );
    }
    apply(&mut r.executor(), &states["cloud"]);
    assert_eq!(table(r), want);

    // The overlay-to-overlay drop, behind WireGuard's check: cloud's entry for home-a widened by
    // hand to the outside source (a stale or hand-edited entry). The drop stops it at cloud;
    // without it cloud sends it on to home-b, whose WireGuard drops it.
    r.wg(&format!("set {dev} peer {} allowed-ips {},{OUTSIDE_SOURCE}/32", a.key(), a.pod_cidr()));
    let hairpinned = r.counted(&hairpin);
    spoof(&a.ns, OUTSIDE_SOURCE, &b.pod_v4(), 5);
    until("cloud's drop counts the 5 datagrams", Duration::from_secs(5), || {
        (r.counted(&hairpin) >= hairpinned + 5).then_some(())
    });
    assert!(seen(r, &into_cloud) >= 5, "they came out of cloud's WireGuard");
    assert_eq!(seen(r, &out_of_cloud), 0, "and went no further");
    println!("MEASURE widened entry: 5 outside-sourced datagrams through cloud's WireGuard, all 5 dropped by the drop");
    r.delete_rule(&hairpin);
    let logged = disallowed(b);
    spoof(&a.ns, OUTSIDE_SOURCE, &b.pod_v4(), 5);
    until("cloud sends them on without the drop", Duration::from_secs(5), || {
        (seen(r, &out_of_cloud) >= 5).then_some(())
    });
    until("home-b's WireGuard drops them", Duration::from_secs(5), || (disallowed(b) >= logged + 5).then_some(()));
    assert_eq!(seen(b, &spoofed), 0);
    println!("MEASURE widened entry, drop deleted: cloud sent 5 on to home-b, whose WireGuard dropped them");
    apply(&mut r.executor(), &states["cloud"]);
    assert_eq!(table(r), want);
    assert_eq!(allowed(r, a), a.pod_cidr(), "the executor narrowed the entry again");

    // An address outside the cluster: home-a (rogue) routes one behind cloud through its entry
    // for cloud, and one behind home-b (a member that is not a relay) through its entry for
    // home-b.
    let entry = format!("{},{},{EXT_BEHIND_CLOUD}/32", r.pod_cidr(), b.pod_cidr());
    a.wg(&format!("set {dev} peer {} allowed-ips {entry}", r.key()));
    a.wg(&format!("set {dev} peer {} allowed-ips {}/32,{EXT_BEHIND_HOME_B}/32", b.key(), b.overlay()));
    for e in [EXT_BEHIND_CLOUD, EXT_BEHIND_HOME_B] {
        a.ns.ip(&["route", "add", &format!("{e}/32"), "dev", &dev]);
    }
    let ext_seen = |link: &str| lab.ext.counted("ip", "seen", &format!("iifname \"{link}\""));
    let dropped = r.counted(outside);
    assert_eq!(ping(&a.pod, EXT_BEHIND_CLOUD), "lost");
    let now = r.counted(outside);
    assert!(now >= dropped + 3, "cloud's drop of the outside counted the 3 datagrams: {dropped} -> {now}");
    assert_eq!(ext_seen("to-cloud"), 0, "nothing reached the network behind cloud");
    println!("MEASURE to an address outside the cluster: 3 datagrams lost, cloud's drop {dropped} -> {now}");
    // Ablation: without it (the relay's table before this rule), cloud is an open forwarder.
    r.delete_rule(outside);
    let got = ping(&a.pod, EXT_BEHIND_CLOUD);
    assert_eq!(got, format!("echo {} 100", a.pod_v4()), "through cloud into the network behind it, and back");
    assert!(ext_seen("to-cloud") >= 1);
    println!("MEASURE without the drop of the outside: ext behind cloud answered home-a's pod ({got})");
    apply(&mut r.executor(), &states["cloud"]);
    assert_eq!(table(r), want);
    assert_eq!(ping(&a.pod, EXT_BEHIND_CLOUD), "lost");
    // A member that is not a relay drops it the same way (docs/overlay/filter.md, rule 3).
    let dropped = b.counted(outside);
    assert_eq!(ping(&a.ns, EXT_BEHIND_HOME_B), "lost");
    let now = b.counted(outside);
    assert!(now >= dropped + 3, "home-b's drop of the outside counted the 3 datagrams: {dropped} -> {now}");
    assert_eq!(ext_seen("to-home-b"), 0, "nothing reached the network behind home-b");
    println!(
        "MEASURE non-relay home-b, home-a's host to the address behind it: lost, home-b's drop {dropped} -> {now}"
    );
    // Ablation: without it, home-b forwards into the network behind it.
    b.delete_rule(outside);
    let got = ping(&a.ns, EXT_BEHIND_HOME_B);
    assert!(got.starts_with("echo "), "through home-b into the network behind it, and back: {got}");
    assert!(ext_seen("to-home-b") >= 1);
    println!("MEASURE without home-b's drop of the outside: ext behind home-b answered home-a ({got})");
    apply(&mut b.executor(), &states["home-b"]);
    println!("done in {:?}", started.elapsed());
}
