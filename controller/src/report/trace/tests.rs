use kuport_proto::v1::PeerStatus;

use super::*;
use crate::compute::overlay::NodeOverlay;

fn report(peers: Vec<PeerStatus>) -> Arc<CounterReport> {
    Arc::new(CounterReport { peers, read_unix_seconds: 1_000, ..Default::default() })
}

fn peer(key: &str, tx: u64, rx: u64) -> PeerStatus {
    PeerStatus {
        public_key: key.into(),
        endpoint: "192.0.2.1:51820".into(),
        last_handshake_unix_seconds: 990,
        transmit_bytes: tx,
        receive_bytes: rx,
        ..Default::default()
    }
}

/// a, b and r in the mesh; a reaches b through r when `relayed`.
fn mesh_outputs(relayed: bool) -> Outputs {
    let mut out = Outputs::default();
    for n in ["a", "b", "r"] {
        let mut o = NodeOverlay { public_key: Some(format!("{n}-key-0123456789")), mtu: 1420, ..Default::default() };
        if relayed && n != "r" {
            o.routes.insert(if n == "a" { "b" } else { "a" }.into(), PeerRoute::Via("r".into()));
        }
        Arc::make_mut(&mut out.overlay).insert(n.into(), Arc::new(o));
    }
    out
}

/// A node's reads: before the watch and now.
type NodeReads<'a> = (&'a str, Option<Arc<CounterReport>>, Arc<CounterReport>);

fn seen_of(watched: u32, reads: Vec<NodeReads<'_>>) -> Seen {
    let mut seen = Seen { watched, ..Default::default() };
    for (n, first, last) in reads {
        seen.reads.insert(n.into(), Ok(Read { first, last }));
    }
    seen
}

#[test]
fn targets_parse_with_protocol_and_ipv6() {
    let t = parse_target("203.0.113.9:27015/udp").expect("parses");
    assert_eq!((t.port, t.protocol), (27015, Protocol::Udp));
    let t = parse_target("[2001:db8::9]:22").expect("parses");
    assert_eq!((t.addr.to_string().as_str(), t.protocol), ("2001:db8::9", Protocol::Tcp));
    assert!(parse_target("203.0.113.9:22/sctp").unwrap_err().contains("sctp"));
    assert!(parse_target("203.0.113.9").is_err());
}

#[test]
fn a_relayed_pair_is_traced_through_its_relay_and_stops_where_bytes_stop() {
    let mut out = mesh_outputs(true);
    assert_eq!(mesh_nodes("a", "b", &out), ["a", "b", "r"]);
    let key = |n: &str| format!("{n}-key-0123456789");
    // a sent to r, r received from a, but r sent nothing on to b.
    let seen = seen_of(
        3,
        vec![
            ("a", Some(report(vec![peer(&key("r"), 100, 0)])), report(vec![peer(&key("r"), 600, 0)])),
            (
                "r",
                Some(report(vec![peer(&key("a"), 0, 100), peer(&key("b"), 50, 0)])),
                report(vec![peer(&key("a"), 0, 600), peer(&key("b"), 50, 0)]),
            ),
            ("b", Some(report(vec![peer(&key("r"), 0, 50)])), report(vec![peer(&key("r"), 0, 50)])),
        ],
    );
    let mut seen = seen;
    let now = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
    seen.now = Some(now);
    let since = now - std::time::Duration::from_secs(45);
    seen.reach_since.insert("a".into(), [(key("b"), since)].into());
    if let Some(o) = Arc::make_mut(&mut out.overlay).get_mut("a") {
        let unreachable = crate::observe::ObservedPeer { reach: Reach::Unreachable, ..Default::default() };
        Arc::make_mut(o).report = Some(Arc::new([(key("b"), unreachable)].into()));
    }
    let r = mesh("a", "b", &out, &seen);
    assert!(r.hops[0].details.iter().any(|d| d == "a reports b unreachable (since 45s ago)"), "{:?}", r.hops[0]);
    assert!(r.hops[0].details.iter().any(|d| d == "b reports a unknown"), "{:?}", r.hops[0]);
    assert_eq!(r.verdict, TraceVerdict::Stopped as i32, "{r:?}");
    assert_eq!(r.stopped_at, "relay out");
    assert!(r.hops[0].object.contains("via r"), "{:?}", r.hops[0]);
    let names: Vec<&str> = r.hops.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["route", "send", "relay in", "relay out", "receive"]);
    assert_eq!(r.hops[1].moved, Some(500));
    assert!(r.hops[1].details.iter().any(|d| d == "last handshake 10s ago"), "{:?}", r.hops[1]);
    assert_eq!(r.hops[3].state, TraceHopState::Stopped as i32);
}

#[test]
fn a_direct_pair_that_moved_both_ways_is_healthy_and_one_read_judges_nothing() {
    let out = mesh_outputs(false);
    let key = |n: &str| format!("{n}-key-0123456789");
    let reads = |watched| {
        seen_of(
            watched,
            vec![
                ("a", Some(report(vec![peer(&key("b"), 10, 0)])), report(vec![peer(&key("b"), 90, 0)])),
                ("b", Some(report(vec![peer(&key("a"), 0, 10)])), report(vec![peer(&key("a"), 0, 90)])),
            ],
        )
    };
    let r = mesh("a", "b", &out, &reads(2));
    assert_eq!(r.verdict, TraceVerdict::Healthy as i32, "{r:?}");
    assert!(r.cause.starts_with("direct: every hop counted the flow"), "{}", r.cause);
    let r = mesh("a", "b", &out, &reads(0));
    assert_eq!(r.verdict, TraceVerdict::Unknown as i32, "{r:?}");
    assert!(r.hops.iter().all(|h| h.moved.is_none()));
}

#[test]
fn a_refused_node_and_an_unread_node_are_said() {
    let mut out = mesh_outputs(false);
    if let Some(b) = Arc::make_mut(&mut out.overlay).get_mut("b") {
        Arc::make_mut(b).refused.push(crate::compute::overlay::Refusal {
            node: "b".into(),
            field: "spec.podCIDRs".into(),
            reason: "NoPodCIDR",
            message: "b has no pod CIDR".into(),
        });
    }
    let mut seen = Seen { watched: 1, ..Default::default() };
    seen.reads.insert("a".into(), Err("node a: its executor is not connected".into()));
    let r = mesh("a", "b", &out, &seen);
    assert_eq!(r.verdict, TraceVerdict::Refused as i32, "{r:?}");
    assert!(r.cause.contains("NoPodCIDR"), "{}", r.cause);
    assert_eq!(r.unanswered, ["a: node a: its executor is not connected"]);
}

#[test]
fn a_counter_remade_by_a_repair_moved_by_its_new_value_and_the_drift_is_named() {
    let mut seen = seen_of(2, vec![("b", Some(report(vec![peer("k", 500, 0)])), report(vec![peer("k", 40, 0)]))]);
    seen.drift.insert("b".into(), (3, 4, vec!["nft table kuport: set return_mark_range: 1 element missing".into()]));
    let c = seen.count("b", |r| r.peers.first().map(|p| p.transmit_bytes));
    assert_eq!(c, Some(Count { now: 40, moved: Some(40), remade: true }));
    let h = counted(hop("return", "b", "return mark element of the pod".into()), c);
    assert!(h.details.iter().any(|d| d.starts_with("remade during the watch")), "{h:?}");
    let said = seen.drift_during("b").expect("drift during the watch");
    assert!(said.contains("b's executor repaired drift 1 time(s)") && said.contains("return_mark_range"), "{said}");
}
