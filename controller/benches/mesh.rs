//! Mesh benchmark: the overlay alone, no PortMaps, where its cost grows with the square of
//! the members (every member's state holds a peer per other member).
//!
//! Run with `cargo bench -p kuport-controller --bench mesh` (release profile). Prints a
//! markdown table. KUPORT_BENCH_MEMBERS picks the sizes, comma-separated (default 1000);
//! KUPORT_BENCH_REPS the repetitions (default 3; median and minimum are reported).
//!
//! Each cluster: Ready nodes with InternalIPs, a key and a /24 of pods each, the first three
//! relay candidates (control-plane nodes); every member reports every peer with a live session
//! (a handshake 30 s ago, at the peer's InternalIP; every tenth member is behind a NAT, and its
//! peers see its packets come from a mapped address, so it has two endpoint candidates), and one
//! pair is broken, so relayed.
//!
//! Each change is computed twice, side by side: by a fresh compute (the whole mesh: what any
//! mesh change cost before the mesh was kept member by member) and by a `Computer` that computed
//! the cluster before the change (untimed). The table gives both, what the Computer made anew
//! (member parts and node states, each also counting those patched: their last with changed
//! peers replaced) and how many node states the change altered (by version), with the most
//! bytes NodeSync sends one of them: as deltas from its namespaces before (docs/design.md,
//! "Deltas"), and whole.

/// The controller's allocator (its `main.rs`), so the benchmark measures what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/machine.rs"]
mod machine;
use cluster::*;
use machine::{loadavg, median_min, ms, proc_status, reset_hwm, timed};

use k8s_openapi::jiff::Timestamp;
use kuport_controller::compute::by_change::Redone;
use kuport_controller::compute::overlay::members::ROTATE_EVERY_SECONDS;
use kuport_controller::compute::overlay::relays::CONTROL_PLANE_LABEL;
use kuport_controller::compute::{Outputs, Settings, compute};
use kuport_controller::observe::{Cluster, ObservedPeer};
use kuport_proto::v1::Reach;

const RELAYS: usize = 3;
/// Where the members behind a NAT are seen from: 198.51.0.0 on.
const NAT: u32 = 0xc633_0000;
const HANDSHAKE_AGO: i64 = 30;

/// `n` members, every one reporting every peer live; members 10 and 11 cannot reach each other.
fn mesh(n: usize) -> Cluster {
    let mut c = build(n, 0, &mut Rng(42));
    join_mesh(&mut c);
    for node in c.nodes.iter_mut().take(RELAYS) {
        node.metadata.labels.get_or_insert_default().insert(CONTROL_PLANE_LABEL.into(), String::new());
    }
    let seen = Timestamp::from_second(c.now.as_second() - HANDSHAKE_AGO).ok();
    let peers: Vec<(String, SocketAddr)> = (0..n)
        .map(|i| {
            let at = if i % 10 == 1 {
                format!("{}:{}", ip(NAT, i), 40_000 + i % 20_000)
            } else {
                format!("{}:51820", ip(UNDERLAY, i))
            };
            (test_key(i), at.parse().expect("an address"))
        })
        .collect();
    for i in 0..n {
        let report: BTreeMap<String, ObservedPeer> = peers
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, (key, at))| {
                (key.clone(), ObservedPeer { endpoint: Some(*at), last_handshake: seen, reach: Reach::Direct })
            })
            .collect();
        c.overlay_observed.reports.insert(node_name(i), Arc::new(report));
    }
    report(&mut c, 10, 11, |p| p.reach = Reach::Unreachable);
    c
}

/// Changes what member `a` reports of member `b`.
fn report(c: &mut Cluster, a: usize, b: usize, f: impl FnOnce(&mut ObservedPeer)) {
    if let Some(p) =
        c.overlay_observed.reports.get_mut(&node_name(a)).and_then(|r| Arc::make_mut(r).get_mut(&test_key(b)))
    {
        f(p);
    }
}

/// The change computed whole, and by a Computer that computed `base` first: each median / min,
/// what the Computer remade, and the node states whose version changed.
fn side_by_side(reps: usize, base: &Cluster, changed: &Cluster, settings: &Settings, before: &Outputs) -> String {
    let mut whole = Vec::new();
    let mut by_change = Vec::new();
    let mut redone = Redone::default();
    let mut altered = 0;
    for _ in 0..reps {
        let (d, _) = timed(|| compute(changed, settings));
        whole.push(d);
        let (d, r, n) = by_change_once(base, changed, settings);
        by_change.push(d);
        (redone, altered) = (r, n);
    }
    let ((wm, wn), (bm, bn)) = (median_min(whole), median_min(by_change));
    let (delta, whole_state) = delta_bytes(before, &compute(changed, settings));
    format!(
        "{} / {} | {} / {} | {} / {} | {} / {} | {altered} | {delta} / {whole_state} |",
        ms(wm),
        ms(wn),
        ms(bm),
        ms(bn),
        redone.mesh_members,
        redone.mesh_patched,
        redone.node_states,
        redone.node_states_patched
    )
}

/// What the stream sends each node state the change altered, as a delta from its state before
/// (`kuport_proto::delta`, what an executor that applied `before` gets): the largest, and the
/// largest whole state, in bytes.
fn delta_bytes(before: &Outputs, after: &Outputs) -> (usize, usize) {
    use prost::Message as _;
    let (mut delta, mut whole) = (0, 0);
    for (name, state) in after.node_states.iter() {
        let Some(was) = before.node_states.get(name).filter(|w| w.netns != state.netns) else { continue };
        let mut sent = 0;
        for ns in &state.netns {
            sent += match was.netns.iter().find(|w| w.target == ns.target) {
                Some(w) if w.version == ns.version => 0,
                Some(w) => kuport_proto::delta::diff(w, ns).encoded_len().min(ns.encoded_len()),
                None => ns.encoded_len(),
            };
        }
        delta = delta.max(sent);
        whole = whole.max(state.encoded_len());
    }
    (delta, whole)
}

fn main() {
    let reps: usize = std::env::var("KUPORT_BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1);
    let sizes: Vec<usize> = std::env::var("KUPORT_BENCH_MEMBERS")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().replace('_', "").parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000]);
    let settings = Settings { overlay: Some(Default::default()) };
    let load_start = loadavg();
    let hwm = reset_hwm();
    let mut table = String::from(
        "| members: change | whole (median / min) | by change (median / min) | members remade / patched | node states made / patched | node states altered | bytes sent an altered state as a delta / whole, max |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut notes = Vec::new();
    for n in sizes {
        eprintln!("{n} members: building");
        let base = mesh(n);
        reset_hwm();
        let rss0 = proc_status("VmRSS:");
        let (cold, out) = timed(|| compute(&base, &settings));
        let peak = proc_status("VmHWM:").saturating_sub(rss0);
        let peers: usize = out.overlay.values().map(|o| o.peers().count()).sum();
        notes.push(format!(
            "{n} members: cold compute {}; {peers} peer entries; peak memory above the inputs {} MiB ({} KiB per member{})",
            ms(cold),
            peak / 1024,
            peak / n as u64,
            if hwm { "" } else { "; VmHWM not resettable here, so an upper bound" }
        ));
        let row = |what: &str, changed: &Cluster| {
            format!("| {n}: {what} | {}", side_by_side(reps, &base, changed, &settings, &out))
        };

        eprintln!("  nothing");
        table.push_str(&row("nothing", &base));
        table.push('\n');

        eprintln!("  a pair breaks");
        let mut broken = base.clone();
        report(&mut broken, 20, 21, |p| p.reach = Reach::Unreachable);
        table.push_str(&row("one reach report: a pair breaks, now relayed", &broken));
        table.push('\n');

        eprintln!("  a handshake");
        let mut refreshed = base.clone();
        let now = refreshed.now;
        report(&mut refreshed, 30, 31, |p| p.last_handshake = Some(now));
        table.push_str(&row("one reach report: a new handshake, no route changes", &refreshed));
        table.push('\n');

        eprintln!("  a rotation");
        let mut silent = base.clone();
        report(&mut silent, 40, 41, |p| p.last_handshake = None); // 41 is behind a NAT
        let mut rotated = silent.clone();
        rotated.now = Timestamp::from_second(silent.now.as_second() + ROTATE_EVERY_SECONDS).unwrap_or(silent.now);
        table.push_str(&format!(
            "| {n}: a silent peer's endpoint rotates (20 s on) | {}\n",
            side_by_side(reps, &silent, &rotated, &settings, &compute(&silent, &settings))
        ));

        eprintln!("  a new key");
        let mut rekeyed = base.clone();
        if let Some(f) = rekeyed.facts.get_mut(50) {
            f.wireguard_public_key = Some(test_key(n + 50));
        }
        table.push_str(&row("one member's new key", &rekeyed));
        table.push('\n');
    }
    println!("Mesh benchmark (`cargo bench -p kuport-controller --bench mesh`), {reps} repetitions");
    println!("Load average at start: {load_start}; at end: {}\n", loadavg());
    print!("{table}");
    println!();
    for n in notes {
        println!("- {n}");
    }
}
