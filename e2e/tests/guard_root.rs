//! Allow-lists with real packets (docs/portmap/guard.md): a mapping's `sourceRanges` admit
//! their clients, who reach the pod with their own address, and every other client gets no
//! answer and is counted against the mapping, on every accepting node, in both families.
//!
//! Single: the default lab, api-0 (worker-2) published on edge-a over the link, and the game's
//! UDP range; client-1 admitted, client-2 not. Multi: the Multi lab's DNS on every worker,
//! client-1 admitted, client-2 refused wherever it enters. Each ends with the ablation: without
//! the allow-list rule the refused client reaches the pod.
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1. Each lab is removed on drop.

mod common;
use common::boundary::assert_lists_as_computed;
use common::dual::assert_maps_any;
use common::*;

use std::collections::BTreeMap;
use std::time::Duration;

use kuport_controller::compute::portmap::steer;
use kuport_lab::Protocol::{self, Tcp, Udp};
use kuport_lab::probe::parse_target;
use kuport_lab::program::{apply, compute};
use kuport_lab::sys::in_netns;
use kuport_lab::{Lab, Manifests, ProbeError};
use kuport_proto::v1::{NodeState, VerdictKind, nft_statement};

const API: &str = "apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: api, namespace: apps}
spec:
  className: public
  protocol: TCP
  port: 9000
  serviceRef: {name: api, port: api}
  sourceRanges: [198.51.100.7/32, \"2001:db8:100::7/128\"]
";

/// Sets a mapping's spec.sourceRanges.
fn admit(m: Manifests, ns: &str, name: &str, ranges: &[&str]) -> Manifests {
    edit_port_map(m, ns, name, |s| s.source_ranges = ranges.iter().map(|r| r.to_string()).collect())
}

/// The packets the guard chains on `node` dropped: every mapping, both families. Each chain is
/// one mapping's (docs/portmap/guard.md), its one rule's counter that mapping's drops.
fn refused(lab: &Lab, node: &str) -> u64 {
    let out = lab.exec(node, &["nft", "list", "table", "inet", "kuport"]).expect("nft lists the table");
    let mut in_guard = false;
    let mut sum = 0;
    for line in out.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("chain ") {
            in_guard = name.starts_with(steer::CHAIN_GUARD);
        } else if in_guard && line.ends_with("drop") {
            let w: Vec<&str> = line.split_whitespace().collect();
            let i = w.iter().position(|w| *w == "packets").unwrap_or_else(|| panic!("no counter in {line}"));
            sum += w[i + 1].parse::<u64>().expect("a number");
        }
    }
    sum
}

/// `client` dials `to` and gets no answer (the request is dropped, not refused by anyone).
fn assert_dropped(lab: &Lab, client: &str, to: &str, proto: Protocol) {
    let dial = parse_target(to).unwrap_or_else(|e| panic!("{e}"));
    match lab.probe_any(client, dial, proto) {
        Err(ProbeError::NoAnswer { .. }) => {}
        other => panic!("{client} -> {to}/{proto} must get no answer: {other:?}"),
    }
}

/// Removes the dispatch to the guard chains from `node`'s steering chain: the ablation.
fn without_guard(states: &mut BTreeMap<String, std::sync::Arc<NodeState>>, node: &str) -> usize {
    drop_rules(host_state(states, node), "kup-steer", |r| {
        r.statements.iter().any(|s| {
            matches!(&s.kind, Some(nft_statement::Kind::VerdictMap(v)) if v.map.starts_with(steer::MAP_GUARD_PORT)
                || v.map.starts_with(steer::MAP_GUARD_RANGE))
        })
    })
}

#[test]
fn single_admits_the_listed_client_in_both_families_and_drops_the_rest() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let m = Manifests::default_lab().add("api.yaml", API).expect("the api mapping loads");
    let m = admit(m, "games", "game", &["198.51.100.7/32"]);
    let mut out = compute(&mut lab, &m);
    assert_eq!(
        condition(&out, "apps", "api", "Programmed").0,
        "True",
        "{}",
        message(&out, "apps", "api", "Programmed")
    );
    apply(&mut lab, &out.node_states).expect("the state applies");
    assert_lists_as_computed(&lab, &mut out.node_states, "edge-a");

    // Admitted: client-1, with its own address, over both families, TCP and the UDP range.
    assert_maps_any(&lab, "client-1", "203.0.113.9:9000", Tcp, "api-0");
    assert_maps_any(&lab, "client-1", "[2001:db8::9]:9000", Tcp, "api-0");
    assert_maps_any(&lab, "client-1", "203.0.113.9:27015", Udp, "game-0");
    assert_maps_any(&lab, "client-1", "203.0.113.9:27115", Udp, "game-0");

    // Refused: client-2 gets no answer in either family, and each drop is counted.
    let before = refused(&lab, "edge-a");
    assert_dropped(&lab, "client-2", "203.0.113.9:9000", Tcp);
    assert_dropped(&lab, "client-2", "[2001:db8::9]:9000", Tcp);
    assert_dropped(&lab, "client-2", "203.0.113.9:27015", Udp);
    // The game admits only IPv4's client-1: IPv6 is closed to everyone.
    assert_dropped(&lab, "client-1", "[2001:db8::9]:27015", Udp);
    let counted = refused(&lab, "edge-a") - before;
    assert!(counted >= 4, "each refused request counted against its mapping: {counted}");

    // Ablation: without the rule, client-2 reaches api-0.
    assert_eq!(without_guard(&mut out.node_states, "edge-a"), 4, "single ports and ranges, both families");
    apply(&mut lab, &out.node_states).expect("the ablated state applies");
    assert_maps_any(&lab, "client-2", "203.0.113.9:9000", Tcp, "api-0");
    assert_maps_any(&lab, "client-2", "[2001:db8::9]:9000", Tcp, "api-0");
}

#[test]
fn multi_every_accepting_node_drops_what_the_list_does_not_admit() {
    if !root() {
        return;
    }
    let mut lab = Lab::up(&kuport_lab::topology::Topology::multi_lab()).expect("the Multi lab builds");
    let workers = ["worker-1", "worker-2", "worker-3"];
    let m = admit(Manifests::multi_lab(), "intranet", "dns", &["100.64.200.1/32", "fd7a:64::200:1/128"]);
    let mut out = compute(&mut lab, &m);
    apply(&mut lab, &out.node_states).expect("the state applies");
    // Each worker's wt0 (e2e/topologies/multi.yaml), in both families.
    let addresses: Vec<(&str, String)> = (1..=3)
        .flat_map(|i| {
            [(workers[i - 1], format!("100.64.0.1{i}:5353")), (workers[i - 1], format!("[fd7a:64::1{i}]:5353"))]
        })
        .collect();
    for (_, to) in &addresses {
        assert_maps_any(&lab, "client-1", to, Udp, "dns-0");
    }
    let before: Vec<u64> = workers.iter().map(|w| refused(&lab, w)).collect();
    for (_, to) in &addresses {
        assert_dropped(&lab, "client-2", to, Udp);
    }
    for (w, b) in workers.iter().zip(before) {
        assert!(refused(&lab, w) > b, "{w} counted client-2's requests");
    }
    // The TCP mapping has no list: client-2 is served there.
    assert_maps_any(&lab, "client-2", "100.64.0.11:5353", Tcp, "dns-0");

    for w in workers {
        assert_eq!(without_guard(&mut out.node_states, w), 2, "{w}: one rule per family");
    }
    apply(&mut lab, &out.node_states).expect("the ablated state applies");
    for (_, to) in &addresses {
        assert_maps_any(&lab, "client-2", to, Udp, "dns-0");
    }
}

/// The list applies to every packet, not only a flow's first: narrowing it cuts a UDP flow that
/// is established (its conntrack entry made), and the cut packets are counted. Ablation: with
/// the dispatch looked up for new connections only, the same flow is answered again.
#[test]
fn a_narrowed_list_cuts_an_established_flow() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let m = admit(Manifests::default_lab(), "games", "game", &["198.51.100.7/32"]);
    let out = compute(&mut lab, &m);
    apply(&mut lab, &out.node_states).expect("the state applies");
    let path = lab.netns("client-1").expect("client-1's namespace");
    // Made in client-1's namespace, the socket stays there.
    let socket = in_netns(&path, || std::net::UdpSocket::bind("0.0.0.0:0")).expect("a socket");
    socket.set_read_timeout(Some(Duration::from_millis(700))).expect("a timeout");
    let to = "203.0.113.9:27015";
    let answered = |s: &std::net::UdpSocket| {
        s.send_to(b"again", to).expect("sent");
        let mut buf = [0u8; 512];
        s.recv(&mut buf).is_ok()
    };
    assert!(answered(&socket), "client-1 is admitted");
    assert!(answered(&socket), "and its flow established");

    let narrowed = admit(m, "games", "game", &["192.0.2.0/24"]);
    let mut states = compute(&mut lab, &narrowed).node_states;
    apply(&mut lab, &states).expect("the narrowed state applies");
    let before = refused(&lab, "edge-a");
    assert!(!answered(&socket), "the established flow is cut");
    assert!(refused(&lab, "edge-a") > before, "and its packet counted");

    let steering = kuport_table(host_state(&mut states, "edge-a")).chains.iter_mut().find(|c| c.name == "kup-steer");
    let mut ablated = 0;
    for r in &mut steering.expect("edge-a steers").rules {
        let guard = r.statements.iter().any(
            |s| matches!(&s.kind, Some(nft_statement::Kind::VerdictMap(v)) if v.map.starts_with(steer::MAP_GUARD_RANGE)),
        );
        if guard {
            r.matches.insert(0, kuport_proto::build::ct_state(kuport_proto::build::ct_state::NEW));
            ablated += 1;
        }
    }
    assert_eq!(ablated, 2, "the game's range, both families");
    apply(&mut lab, &states).expect("the ablated state applies");
    assert!(answered(&socket), "new connections only: the established flow passes");
}

/// A reply is never a request to a published port (docs/portmap/guard.md, "Replies skip the
/// chain"): edge-a's own UDP socket on a port of the game's published range, whose list admits
/// only 192.0.2.0/24, gets client-1's answer. Ablation: without the reply skip, the answer is
/// looked up as a request to the game, and the allow-list drops it.
#[test]
fn a_nodes_own_flow_from_a_published_port_gets_its_replies() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let m = admit(Manifests::default_lab(), "games", "game", &["192.0.2.0/24"]);
    let mut states = compute(&mut lab, &m).node_states;
    apply(&mut lab, &states).expect("the state applies");
    let client = lab.netns("client-1").expect("client-1's namespace");
    let echo = in_netns(&client, || std::net::UdpSocket::bind("0.0.0.0:7777")).expect("client-1's echo");
    echo.set_read_timeout(Some(Duration::from_secs(3))).expect("a timeout");
    let echoing = std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        let mut answered = 0;
        while let Ok((n, from)) = echo.recv_from(&mut buf) {
            answered += usize::from(echo.send_to(&buf[..n], from).is_ok());
        }
        answered
    });
    let edge = lab.netns("edge-a").expect("edge-a's namespace");
    let answered = |port: u16| {
        let s = in_netns(&edge, || std::net::UdpSocket::bind(("203.0.113.9", port))).expect("edge-a's socket");
        s.set_read_timeout(Some(Duration::from_millis(700))).expect("a timeout");
        s.send_to(b"own", "198.51.100.7:7777").expect("sent");
        let mut buf = [0u8; 512];
        s.recv(&mut buf).is_ok()
    };
    assert!(answered(27020), "edge-a's own flow from a published port is answered");

    let skip = drop_rules(host_state(&mut states, "edge-a"), "kup-steer", |r| {
        r.statements
            .iter()
            .any(|s| matches!(&s.kind, Some(nft_statement::Kind::Verdict(v)) if v.kind == VerdictKind::Accept as i32))
    });
    assert_eq!(skip, 1, "one reply skip");
    apply(&mut lab, &states).expect("the ablated state applies");
    let before = refused(&lab, "edge-a");
    assert!(!answered(27021), "without the skip, the answer is taken for a request and dropped");
    assert!(refused(&lab, "edge-a") > before, "by the game's allow-list");
    assert!(echoing.join().expect("the echo") >= 2, "client-1 answered both");
}
