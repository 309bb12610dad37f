//! The port-map table served to both families from one `table inet kuport` (docs/portmap/
//! firewall.md, datapath.md) through kuport's own nf_tables codec, with the `nft` CLI as the
//! oracle, in scratch network namespaces: our apply of tests/data/kuport_inet.rs lists exactly
//! like tests/data/kuport_inet.nft and like `nft -f` of it, holds nft's own expressions, reads
//! back equal (nft's own table too), writes nothing on a re-apply and is repaired; a node
//! upgraded from `table ip kuport` loses that table in the transaction that creates the inet
//! one; and real IPv4 and IPv6 connections through the table reach a server that sees each
//! client's own address. They fail when not run as root unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/echo.rs"]
mod echo;
#[path = "common/host.rs"]
mod host;
#[path = "common/netns.rs"]
mod netns;
use echo::{Proc, script, until};
use host::{root, run};
use netns::Netns;

include!("data/kuport_inet.rs");

use std::process::Stdio;
use std::time::Duration;

use kuport_node_exec::executor::Executor;
use kuport_node_exec::nft::{ApplyMode, apply_table, normalize, read_table};
use kuport_proto::build::{addr, element, ifname, port, proto};
use kuport_proto::v1::{L4Proto, NetnsState, NftFamily, NftTable};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/kuport_inet.nft");

/// `nft -s list table inet kuport` in `ns`.
fn list(ns: &Netns) -> String {
    ns.nft(&["-s", "list", "table", "inet", "kuport"])
}

/// The expected listing: tests/data/kuport_inet.nft without its comment lines.
fn expected() -> String {
    let text = std::fs::read_to_string(FILE).expect("kuport_inet.nft");
    text.lines().filter(|l| !l.starts_with('#')).map(|l| format!("{l}\n")).collect()
}

/// The handle of the first rule of `chain` whose listing contains `needle`.
fn handle(ns: &Netns, chain: &str, needle: &str) -> String {
    let listed = ns.nft(&["-a", "list", "chain", "inet", "kuport", chain]);
    listed
        .lines()
        .find(|l| l.contains(needle))
        .and_then(|l| l.rsplit("# handle ").next())
        .unwrap_or_else(|| panic!("a rule with {needle} in {listed}"))
        .trim()
        .to_string()
}

#[test]
fn inet_table_lists_like_nft_reads_back_and_is_repaired() {
    if !root() {
        return;
    }
    let desired = kuport_inet_table();
    let (ours, theirs) = (Netns::new("inet", "ours"), Netns::new("inet", "theirs"));
    let r = apply_table(Some(&ours.path()), &desired).expect("apply");
    assert_eq!((r.mode, r.batches), (ApplyMode::Replaced, 1));
    assert_eq!(list(&ours), expected(), "our apply lists as tests/data/kuport_inet.nft");
    theirs.nft(&["-f", FILE]);
    assert_eq!(list(&theirs), expected(), "nft -f of the file lists as the file");

    // The kernel holds nft's own expressions: one `meta nfproto` per rule with an address
    // (every rule but the four published maps' DNATs and the two of ct mark), the IPv6
    // write with no header checksum.
    let exprs = |ns: &Netns| ns.nft(&["--debug=netlink", "list", "table", "inet", "kuport"]);
    let held = exprs(&ours);
    assert_eq!(held, exprs(&theirs));
    assert_eq!(held.matches("[ meta load nfproto => reg 1 ]").count(), 13, "{held}");
    assert_eq!(held.matches("16b @ network header + 24 csum_type 0 csum_off 0 csum_flags 0x1 ]").count(), 2);
    assert_eq!(held.matches("4b @ network header + 16 csum_type 1 csum_off 10 csum_flags 0x1 ]").count(), 2);

    let again = apply_table(Some(&ours.path()), &desired).expect("re-apply");
    assert_eq!((again.mode, again.writes, again.batches), (ApplyMode::Unchanged, 0, 0), "{:?}", again.diffs);
    let back = read_table(Some(&ours.path()), NftFamily::Inet, "kuport").expect("read").expect("exists");
    assert_eq!(back, normalize(&desired).expect("normalize"));
    let theirs_back = read_table(Some(&theirs.path()), NftFamily::Inet, "kuport").expect("read").expect("exists");
    assert_eq!(theirs_back, back, "nft's own table decompiles to the same model");

    // Drift: the IPv6 range's steering rule and the IPv6 identity SNAT deleted by hand come back.
    let steer = handle(&ours, "kup-steer", "@steer_range6");
    ours.nft(&["delete", "rule", "inet", "kuport", "kup-steer", "handle", &steer]);
    let snat = handle(&ours, "kup-post", "@claim6");
    ours.nft(&["delete", "rule", "inet", "kuport", "kup-post", "handle", &snat]);
    assert_ne!(list(&ours), expected());
    let r = apply_table(Some(&ours.path()), &desired).expect("repair");
    assert!(r.writes > 0, "{:?}", r.diffs);
    assert_eq!(list(&ours), expected());

    // Drift in an element: an IPv6 stand-in changed by hand is put back in place.
    let key = "\"enp1s0\" . 2001:db8::9 . tcp . 3000";
    ours.nft(&["delete", "element", "inet", "kuport", "steer_port6", &format!("{{ {key} }}")]);
    ours.nft(&["add", "element", "inet", "kuport", "steer_port6", &format!("{{ {key} : fd6b:7570::1 }}")]);
    let r = apply_table(Some(&ours.path()), &desired).expect("repair element");
    assert_eq!(r.mode, ApplyMode::Elements, "{:?}", r.diffs);
    assert_eq!(list(&ours), expected());
}

/// What a node upgraded from the IPv4-only `table ip kuport` applies: the controller's state now
/// holds `table inet kuport`. The executor owns every table named kuport* in any family, so the
/// old one is extra and goes, in the same transaction that creates the new one (no moment with
/// both hooked, none with neither); with more elements than one transaction holds, it still goes.
#[test]
fn upgrading_to_the_inet_table_deletes_the_ip_table() {
    if !root() {
        return;
    }
    let ns = Netns::new("inet", "upgrade");
    ns.nft(&["-f", concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/kuport_example.nft")]);
    assert!(ns.nft(&["list", "tables"]).contains("table ip kuport"));
    let state = NetnsState { nft_tables: vec![kuport_inet_table()].into(), ..Default::default() };
    let mut ex = Executor::new(Some(ns.path()));
    let report = ex.apply(&state).unwrap_or_else(|e| panic!("apply: {e}"));
    assert_eq!(ns.nft(&["list", "tables"]), "table inet kuport\n");
    assert_eq!(list(&ns), expected());
    let actions = report.actions.join("\n");
    assert!(actions.contains("nft tables: 1 created and 1 deleted"), "{actions}");
    assert!(actions.contains("in 1 transaction(s)"), "one transaction: {actions}");
    assert!(actions.contains("delete nft table ip kuport"), "{actions}");
    let again = ex.apply(&state).unwrap_or_else(|e| panic!("re-apply: {e}"));
    assert_eq!(again.writes, 0, "{:?}", again.actions);

    // Over one transaction's budget, the new table is applied alone and the old one deleted
    // after it.
    let ns = Netns::new("inet", "upgrade-big");
    ns.nft(&["-f", concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/kuport_example.nft")]);
    let mut big = kuport_inet_table();
    let publish = big.sets.iter_mut().find(|s| s.name == "publish_port6").expect("publish_port6");
    publish.elements = (0..1500)
        .map(|i| {
            element(vec![ifname("enp1s0"), proto(L4Proto::Tcp), port(10_000 + i)], vec![addr("fd00::7"), port(3000)])
        })
        .collect();
    let state = NetnsState { nft_tables: vec![big].into(), ..Default::default() };
    let mut ex = Executor::new(Some(ns.path()));
    let report = ex.apply(&state).unwrap_or_else(|e| panic!("apply: {e}"));
    assert_eq!(ns.nft(&["list", "tables"]), "table inet kuport\n", "{:?}", report.actions);
}

/// A published port through the inet table with real packets, both families, with the steering
/// chain in front (docs/portmap/firewall.md): a client namespace dials the accepting namespace's
/// address on enp1s0; the steering chain rewrites it to the stand-in, the DNAT maps send it on to
/// the server namespace, which answers with the address it saw: each client's own. The replies
/// come back from the address dialed (the client's socket only accepts those).
#[test]
fn ipv6_and_ipv4_clients_reach_the_server_with_their_own_address() {
    if !root() {
        return;
    }
    let (client, edge, server) =
        (Netns::new("inet", "client"), Netns::new("inet", "edge"), Netns::new("inet", "server"));
    let veth = |a: &Netns, a_if: &str, b: &Netns, b_if: &str| {
        run("ip", &["link", "add", a_if, "netns", &a.name, "type", "veth", "peer", "name", b_if, "netns", &b.name]);
        a.ip(&["link", "set", a_if, "up"]);
        b.ip(&["link", "set", b_if, "up"]);
    };
    veth(&client, "eth0", &edge, "enp1s0");
    veth(&server, "eth0", &edge, "cilium_host");
    let addr6 = |ns: &Netns, a: &str, dev: &str| ns.ip(&["-6", "addr", "add", a, "dev", dev, "nodad"]);
    client.ip(&["addr", "add", "192.0.2.2/24", "dev", "eth0"]);
    addr6(&client, "fd00:c::2/64", "eth0");
    client.ip(&["route", "add", "default", "via", "192.0.2.1"]);
    client.ip(&["-6", "route", "add", "default", "via", "fd00:c::1"]);
    edge.ip(&["addr", "add", "192.0.2.1/24", "dev", "enp1s0"]);
    edge.ip(&["addr", "add", "203.0.113.9/32", "dev", "enp1s0"]);
    addr6(&edge, "fd00:c::1/64", "enp1s0");
    addr6(&edge, "2001:db8::9/128", "enp1s0");
    edge.ip(&["addr", "add", "10.244.18.1/24", "dev", "cilium_host"]);
    addr6(&edge, "fd00:10:244:18::1/64", "cilium_host");
    server.ip(&["addr", "add", "10.244.18.7/24", "dev", "eth0"]);
    addr6(&server, "fd00:10:244:18::7/64", "eth0");
    server.ip(&["route", "add", "default", "via", "10.244.18.1"]);
    server.ip(&["-6", "route", "add", "default", "via", "fd00:10:244:18::1"]);
    for key in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
        run("ip", &["netns", "exec", &edge.name, "sysctl", "-qw", key]);
    }

    // The example's table, with UDP published on port 3000 too (and steered), so that the echo
    // client's datagram and stream both go through.
    let mut desired: NftTable = kuport_inet_table();
    for (name, pod) in [("publish_port", "10.244.18.7"), ("publish_port6", "fd00:10:244:18::7")] {
        let s = desired.sets.iter_mut().find(|s| s.name == name).expect("publish map");
        s.elements.push(element(vec![ifname("enp1s0"), proto(L4Proto::Udp), port(3000)], vec![addr(pod), port(3000)]));
    }
    for (name, dialed, stand_in) in
        [("steer_port", "203.0.113.9", "169.254.76.237"), ("steer_port6", "2001:db8::9", "fd6b:7570::1:bae4")]
    {
        let s = desired.sets.iter_mut().find(|s| s.name == name).expect("steer map");
        s.elements
            .push(element(vec![ifname("enp1s0"), addr(dialed), proto(L4Proto::Udp), port(3000)], vec![addr(stand_in)]));
    }
    apply_table(Some(&edge.path()), &desired).expect("apply");

    let child = server
        .command(&["python3", echo::SCRIPT, "serve", "3000"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("echo server");
    let _server = ready(child);

    for (dialed, own) in [("2001:db8::9", "fd00:c::2"), ("203.0.113.9", "192.0.2.2")] {
        let out = until(&format!("an answer through {dialed}"), Duration::from_secs(10), || {
            let out = script(&client, &["client", dialed, "3000", "1000"]);
            out.contains("tcp ").then_some(out)
        });
        assert!(out.contains(&format!("udp {own} 6")), "the server saw {out:?}, not {own}");
        assert!(out.contains(&format!("tcp {own} 1000")), "the server saw {out:?}, not {own}");
    }
    // Both went through the steering chain and the published maps of their family.
    for map in ["steer_port6", "publish_port6", "steer_port", "publish_port"] {
        let listed = edge.nft(&["list", "map", "inet", "kuport", map]);
        assert!(listed.matches("counter packets 0 ").count() < listed.matches("counter packets").count(), "{listed}");
    }
}

/// Waits for the echo server's "ready" line.
fn ready(mut child: std::process::Child) -> Proc {
    use std::io::BufRead as _;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("ready");
    assert_eq!(line.trim(), "ready");
    Proc(child)
}
