//! Hole punching in the lab, measured (docs/overlay/relays.md, "The lab", the punch variant):
//! two homes behind port-preserving routers (`e2e/topologies/homes-punch.yaml`), with no port
//! forward. They start relayed through the cloud node; the test then watches whether and when
//! the pair goes direct, and prints what the routers' conntrack holds for the two homes' flows
//! (which port each NAT gave them). Oracles: each home's stored state and `wg show` (which entry
//! holds the other home's pod CIDR), the relay rule's counter on cloud, the pods' probes.
//!
//! Nothing punches a hole yet: with the executors' turns, each side's probes leave a stale entry
//! on the other's router that gives the other side's flow a new port, and the pair stays
//! relayed. So the test asserts only that the pods reach each other through cloud, and when the
//! pair does go direct, that pod traffic then crosses no relay and that a cut and its repair
//! bring it back. A measurement of minutes, so ignored by default:
//! `cargo test -p kuport-lab --test punch_root -- --ignored --nocapture`
//! (`KUPORT_PUNCH_WITHIN`: seconds to watch for direct, 300 by default).
//!
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1.

mod common;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::homes::{self, A, B, Homes};

/// How long to watch for the pair going direct.
fn within() -> Duration {
    let secs = std::env::var("KUPORT_PUNCH_WITHIN").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    Duration::from_secs(secs)
}

/// Waits until both homes hold the pair direct, after it was relayed; when, and the second of
/// the wall clock's minute it was then (the executors' turns go by the wall clock). None when
/// not within `within`.
fn wait_direct(h: &Homes, within: Duration) -> Option<(Instant, u64)> {
    let start = Instant::now();
    while start.elapsed() < within {
        let held = [(A, B), (B, A)].map(|(n, p)| h.applied_route(n, p));
        if held.iter().all(|r| r == "direct") {
            let wall = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
            return Some((Instant::now(), wall.as_secs() % 60));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// The two routers' conntrack entries between the homes, and the endpoint each home's WireGuard
/// holds for the other.
fn print_nat(h: &Homes) {
    let publics = ["203.0.113.20", "203.0.113.21"];
    for home in [A, B] {
        let flows: Vec<String> = h
            .router_conntrack(home)
            .lines()
            .filter(|l| publics.iter().all(|p| l.contains(&format!("={p} "))))
            .map(str::to_string)
            .collect();
        println!("{home}'s router, the homes' flows: {flows:#?}");
    }
    println!("{A} holds {} for {B}, {B} holds {} for {A}", endpoint(h, A, B), endpoint(h, B, A));
}

/// The endpoint `node`'s WireGuard holds for `peer`, from `wg show dump`.
fn endpoint(h: &Homes, node: &str, peer: &str) -> String {
    let key = h.mesh.published_key(peer);
    let Some(dump) = h.mesh.try_dump(node) else { return "none".into() };
    dump.peers.iter().find(|p| p[0] == key).map(|p| p[2].clone()).unwrap_or_default()
}

#[test]
#[ignore = "a measurement of minutes: whether two port-preserving NATs' homes go direct"]
fn homes_behind_port_preserving_routers_with_no_port_forward() {
    if !common::root() {
        return;
    }
    let mut h = Homes::start_on("punch", &homes::punch_lab());
    let started = h.mesh.started;
    // The homes do not reach each other at first: relayed through cloud.
    h.transition("start", started, "via cloud");
    h.relay_carries_pods();

    let Some((direct, second)) = wait_direct(&h, within()) else {
        println!(
            "MEASURE punch: {A}–{B} not direct {:.0} s after the lab start ({:?} watched after the relay)",
            started.elapsed().as_secs_f64(),
            within()
        );
        print_nat(&h);
        // Still relayed, and the pods still reach each other.
        assert_eq!([h.applied_route(A, B), h.applied_route(B, A)], ["via cloud", "via cloud"]);
        h.pods_both_ways();
        return;
    };
    let t = h.transition_within("direct", started, "direct", Duration::from_secs(10));
    println!(
        "MEASURE punch: direct {:.1} s after the lab start (route applied, second {second} of the minute), first packet {:.1} s",
        direct.duration_since(started).as_secs_f64(),
        t.first_packet.as_secs_f64(),
    );
    print_nat(&h);
    h.nothing_relayed();

    // Cut at home-a's router: back through cloud. Held past a NAT's UDP timeout, then repaired.
    let event = Instant::now();
    h.cut(A, B, true);
    h.transition("cut", event, "via cloud");
    std::thread::sleep(Duration::from_secs(45));
    let event = Instant::now();
    h.cut(A, B, false);
    match wait_direct(&h, within()) {
        Some((direct, second)) => println!(
            "MEASURE punch: direct {:.1} s after the cut was removed (second {second} of the minute)",
            direct.duration_since(event).as_secs_f64()
        ),
        None => println!("MEASURE punch: not direct within {:?} after the cut was removed", within()),
    }
    print_nat(&h);
    for t in &h.transitions {
        println!("measured: {t}");
    }
}
