//! Compute benchmark: the controller's pure computation over synthetic clusters.
//!
//! Run with `cargo bench -p kuport-controller --bench compute` (release profile). Prints a
//! markdown table. KUPORT_BENCH_SIZES picks sizes by node count, comma-separated (of 100, 1000,
//! 5000; default all three); KUPORT_BENCH_REPS sets the repetitions (default 3; median and
//! minimum are reported). KUPORT_BENCH_STAGES=0 skips the per-stage timing.
//!
//! Each cluster: Ready nodes with InternalIPs and NodeFacts (underlay address, MTU,
//! interfaces); ten edge nodes carrying four Vxlan PortMapClasses (two Single, two Multi);
//! PortMaps in 100 namespaces, each pointing at its own Service whose three pods are spread
//! over all nodes (so most mappings need links); every tenth mapping publishes a UDP range of
//! ten ports, every tenth a single UDP port, the rest a single TCP port.
//!
//! Measured per size:
//! - first compute: no class status yet, so every link slot is claimed (one run);
//! - steady compute: classes carry the link rows the first compute wrote, and PortMaps their
//!   statuses, as after any restart;
//! - one-endpoint change: the chosen pod of one mapping moves to another node, full recompute,
//!   and how many node states changed (by `kuport_proto::version`);
//! - by change: that move, its statuses written back, and a PortMap created (the youngest,
//!   over links the cluster has; then one that needs links anew) and deleted, each by a
//!   `Computer` that computed the cluster before, beside the whole compute;
//! - peak memory (VmHWM, reset through /proc/self/clear_refs) per PortMap;
//! - node state sizes (prost encoded_len): largest and sum.
//!
//! The other two capabilities, on request: KUPORT_BENCH_MESH=1 puts every node in the WireGuard
//! mesh (a key and its pods' /24 each), and the notes then time one member's new key;
//! KUPORT_BENCH_INTERCEPTS=N labels every Nth pod Running for an Intercept per namespace, and
//! the notes time one pod relabelled out. Each note counts the node states the change altered.

/// The controller's allocator (its `main.rs`), so the benchmark measures what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/machine.rs"]
mod machine;
use cluster::*;
use machine::{cpu_time, loadavg, median_min, ms, proc_status, reset_hwm, timed};

use kuport_controller::api::Protocol;
use kuport_controller::compute::by_change::Redone;
use kuport_controller::compute::portmap::admission::{self, MapKey};
use kuport_controller::compute::portmap::datapath::{Builder, LinkEnd};
use kuport_controller::compute::portmap::links::{self, LinkKey};
use kuport_controller::compute::portmap::placement::{self, Placement};
use kuport_controller::compute::portmap::status::Refusal;
use kuport_controller::compute::{Outputs, Settings, compute};
use kuport_controller::observe::index::{Indexes, View};
use kuport_controller::observe::{Cluster, Objects};
use kuport_proto::v1::NodeState;
use prost::Message as _;

/// (nodes, PortMaps) measured by default; pods are PODS_PER_SERVICE per PortMap.
const SIZES: [(usize, usize); 3] = [(100, 1_000), (1_000, 10_000), (5_000, 50_000)];
const DEFAULT_REPS: usize = 3;
/// A first compute slower than this is measured once, and larger sizes are skipped.
const TOO_SLOW: Duration = Duration::from_secs(60);

/// Writes the statuses a compute decided into the classes (their link rows) and the PortMaps,
/// as the controller does.
/// Only the objects whose status changes are copied, as a watch cache replaces only those.
fn with_statuses(c: &mut Cluster, out: &Outputs) {
    for i in 0..c.classes.len() {
        let status = c.classes[i].metadata.name.as_ref().and_then(|n| out.classes.get(n));
        if c.classes[i].status.as_ref() != status {
            let status = status.cloned();
            if let Some(class) = c.classes.get_mut(i) {
                class.status = status;
            }
        }
    }
    for i in 0..c.port_maps.len() {
        let status = out.port_maps.get(&admission::key_of(&c.port_maps[i]));
        if c.port_maps[i].status.as_ref() != status {
            let status = status.cloned();
            if let Some(pm) = c.port_maps.get_mut(i) {
                pm.status = status;
            }
        }
    }
}

/// `f` run `reps` times: the durations and the last result.
fn repeated<T: Default>(reps: usize, mut f: impl FnMut() -> T) -> (Vec<Duration>, T) {
    let mut times = Vec::new();
    let mut last = T::default();
    for _ in 0..reps {
        let (d, v) = timed(&mut f);
        times.push(d);
        last = v;
    }
    (times, last)
}

/// The stages of `compute`, copied (they are public except link_ends and the statuses), timed.
fn stages(c: &Cluster) -> Vec<(&'static str, Duration)> {
    let mut times = Vec::new();
    let t = Instant::now();
    let indexes = Indexes::of(c);
    let view = View::new(c, &indexes);
    let vxlan: BTreeMap<String, _> =
        view.classes.iter().map(|(n, cl)| (n.clone(), links::class_vxlan(cl, &view))).collect();
    times.push(("observe (View::new)", t.elapsed()));
    let t = Instant::now();
    let (admitted, _) = admission::admit(&view, &c.port_maps);
    times.push(("admission::admit", t.elapsed()));
    let t = Instant::now();
    let mut verdicts: Vec<(MapKey, Result<Placement, Refusal>)> = Vec::new();
    let mut by_pod: BTreeMap<(Ipv4Addr, Protocol), Vec<usize>> = BTreeMap::new();
    for (key, _, a) in admitted {
        let placed = a.and_then(|a| placement::place(&view, a));
        let placed = placed.and_then(|p| {
            let pod = (p.endpoint.address, p.admitted.protocol);
            let clash = by_pod.get(&pod).into_iter().flatten().any(|i| {
                matches!(&verdicts[*i], (_, Ok(q)) if placement::same_pod_port(&p, q) && p.return_route() != q.return_route())
            });
            if clash { Err(Refusal::programmed("Clash", String::new())) } else { Ok(p) }
        });
        if let Ok(p) = &placed {
            by_pod.entry((p.endpoint.address, p.admitted.protocol)).or_default().push(verdicts.len());
        }
        verdicts.push((key, placed));
    }
    times.push(("placement::place + return check", t.elapsed()));
    let t = Instant::now();
    let mut needed = BTreeSet::new();
    for (_, v) in &verdicts {
        if let Ok(p) = v {
            for node in p.remote_nodes() {
                needed.insert(LinkKey::new(&p.admitted.class_name, node, &p.endpoint.node));
            }
        }
    }
    let alloc = links::allocate(&|n| view.node(n).exists, &view.classes, &vxlan, &needed, c.now);
    times.push(("links (needed set + allocate)", t.elapsed()));
    let t = Instant::now();
    let all_nodes =
        view.nodes.keys().cloned().chain(view.classes.values().flat_map(|cl| cl.spec.nodes.keys().cloned()));
    let mut builder = Builder::new(all_nodes);
    for (_, v) in &verdicts {
        let Ok(p) = v else { continue };
        let mut ends = BTreeMap::new();
        let mut ok = true;
        for node in p.remote_nodes() {
            let key = LinkKey::new(&p.admitted.class_name, node, &p.endpoint.node);
            let Some(Ok(numbers)) = alloc.needed.get(&key) else {
                ok = false;
                break;
            };
            match (LinkEnd::new(&view, &key, numbers, node), LinkEnd::new(&view, &key, numbers, &p.endpoint.node)) {
                (Some(near), Some(far)) => {
                    ends.insert(node.clone(), (near, far));
                }
                _ => ok = false,
            }
        }
        if ok {
            let device = match view.node(&p.endpoint.node).route_to(p.endpoint.address) {
                kuport_controller::observe::index::RouteTo::Device(d) => Some(d),
                _ => None,
            };
            builder.add(p, &ends, device.as_deref());
        }
    }
    times.push(("datapath: link ends + Builder::add", t.elapsed()));
    let t = Instant::now();
    let states: Vec<NodeState> = builder
        .finish(&view)
        .into_iter()
        .map(|(node, (host, _))| {
            let mut state = NodeState { node, netns: vec![host] };
            kuport_proto::canonicalize(&mut state);
            state
        })
        .collect();
    times.push(("datapath: Builder::finish (render)", t.elapsed()));
    std::hint::black_box(states);
    times
}

struct Row {
    nodes: usize,
    maps: usize,
    pods: usize,
    build: Duration,
    first: Duration,
    steady_cpu: Duration,
    steady: (Duration, Duration),
    change: (Duration, Duration),
    changed: usize,
    standby_changed: usize,
    peak_kib_per_map: f64,
    input_kib_per_map: f64,
    max_state: usize,
    sum_states: usize,
    states: usize,
    programmed: usize,
    links: usize,
}

/// The inputs with every object copied, not shared.
fn deep_copy(c: &Cluster) -> Cluster {
    fn each<K: Clone>(o: &Objects<K>) -> Objects<K> {
        o.iter().cloned().collect()
    }
    Cluster {
        nodes: each(&c.nodes),
        namespaces: each(&c.namespaces),
        services: each(&c.services),
        endpoint_slices: each(&c.endpoint_slices),
        classes: each(&c.classes),
        port_maps: each(&c.port_maps),
        intercepts: each(&c.intercepts),
        pods: each(&c.pods),
        ..c.clone()
    }
}

/// A change computed by a [`Computer`] that computed `base` just before (untimed), `reps`
/// times: median, minimum, what it redid, and the node states whose version changed.
fn by_change(
    reps: usize,
    base: &Cluster,
    changed: &Cluster,
    settings: &Settings,
) -> (Duration, Duration, Redone, usize) {
    let mut times = Vec::new();
    let mut redone = Redone::default();
    let mut versions_changed = 0;
    for _ in 0..reps {
        let (d, r, n) = by_change_once(base, changed, settings);
        times.push(d);
        (redone, versions_changed) = (r, n);
    }
    let (median, min) = median_min(times);
    (median, min, redone, versions_changed)
}

/// The cluster with a PortMap after the last: in team-000 and class public as pm-00000, its
/// pods on the nodes of pm-00000's, so it rides links the cluster has; or, `anew`, one pod on
/// a node that no link of the class reaches, so it needs a link from each accepting node.
fn with_one_more(cluster: &Cluster, anew: bool) -> Cluster {
    let mut c = cluster.clone();
    let slice = c.endpoint_slices.iter().find(|s| s.metadata.name.as_deref() == Some(slice_name("pm-00000").as_str()));
    let mut nodes: Vec<String> =
        slice.and_then(|s| s.endpoints.as_ref()).into_iter().flatten().filter_map(|e| e.node_name.clone()).collect();
    let class = c.classes.iter().find(|k| k.metadata.name.as_deref() == Some(CLASSES[0].0));
    if anew && let Some(class) = class {
        let linked: BTreeSet<&String> = class.status.iter().flat_map(|s| &s.links).flat_map(|r| &r.pair).collect();
        let unlinked = c
            .nodes
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .find(|n| !linked.contains(n) && !class.spec.nodes.contains_key(n));
        nodes = unlinked.into_iter().collect();
    }
    let pods = nodes
        .into_iter()
        .enumerate()
        .map(|(k, node)| {
            let i = c.nodes.iter().position(|n| n.metadata.name.as_deref() == Some(node.as_str())).unwrap_or(0);
            (pod_address(i, 240 + k), node)
        })
        .collect();
    add_mapping(
        &mut c,
        Mapping {
            name: "new-00000".into(),
            ns: "team-000".into(),
            class: CLASSES[0].0,
            protocol: Protocol::Tcp,
            port: 40_000,
            end_port: None,
            pod_port: 8_080,
            pods,
            created: 1_800_000_000,
        },
    );
    c
}

/// The by-change line of `changed`: computed whole `reps` times, and by a Computer that
/// computed `base` before.
fn compared(what: &str, reps: usize, base: &Cluster, changed: &Cluster, settings: &Settings) -> String {
    let whole = repeated(reps, || compute(changed, settings)).0;
    by_change_row(what, median_min(whole), by_change(reps, base, changed, settings))
}

/// One line of the by-change table: the change, the whole compute's median / min, the
/// Computer's, what it redid.
fn by_change_row(
    what: &str,
    whole: (Duration, Duration),
    (median, min, r, changed): (Duration, Duration, Redone, usize),
) -> String {
    let port_maps = format!(
        "port maps ({}{}{} placed, {} statuses made, {} hosts rendered)",
        if r.port_maps_patched { "patched, " } else { "" },
        if r.port_maps_readmitted { "verdicts kept, " } else { "" },
        r.port_maps_placed,
        r.port_map_statuses,
        r.port_map_hosts
    );
    let redid: Vec<&str> = [(r.mesh, "mesh"), (r.port_maps, port_maps.as_str()), (r.intercepts, "interception")]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
    let redid = if redid.is_empty() { "nothing".to_string() } else { redid.join(", ") };
    format!(
        "| {what} | {} / {} | {} / {} | {redid} | {} | {changed} |",
        ms(whole.0),
        ms(whole.1),
        ms(median),
        ms(min),
        r.node_states
    )
}

fn main() {
    let reps: usize =
        std::env::var("KUPORT_BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_REPS).max(1);
    let wanted: Option<Vec<usize>> = std::env::var("KUPORT_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().replace('_', "").parse().ok()).collect());
    let sizes: Vec<(usize, usize)> = match &wanted {
        None => SIZES.to_vec(),
        Some(w) => w.iter().map(|n| SIZES.iter().copied().find(|(s, _)| s == n).unwrap_or((*n, n * 10))).collect(),
    };
    let stages_on = std::env::var("KUPORT_BENCH_STAGES").map(|v| v != "0").unwrap_or(true);
    let mesh = std::env::var("KUPORT_BENCH_MESH").is_ok_and(|v| v == "1");
    let intercept_every: Option<usize> =
        std::env::var("KUPORT_BENCH_INTERCEPTS").ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0);
    let settings = Settings { overlay: mesh.then(Default::default) };
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let load_start = loadavg();
    let hwm_resettable = reset_hwm();
    let mut rows = Vec::new();
    let mut stage_report = String::new();
    let mut notes = Vec::new();
    let mut by_change_rows = Vec::new();

    for (n_nodes, n_maps) in sizes {
        eprintln!("size {n_nodes} nodes, {n_maps} PortMaps: building");
        reset_hwm();
        let rss0 = proc_status("VmRSS:");
        let (build_time, mut cluster) = timed(|| {
            let mut c = build(n_nodes, n_maps, &mut Rng(42));
            if mesh {
                join_mesh(&mut c);
            }
            if let Some(every) = intercept_every {
                add_intercepts(&mut c, every);
            }
            c
        });
        let rss_input = proc_status("VmRSS:").saturating_sub(rss0);
        // What the hub's compute_now copies of its inputs before every compute, beside what a copy
        // of every object (the inputs before they were shared) costs.
        let (times, copies) = repeated(reps, || cluster.clone());
        drop(copies);
        let (median, min) = median_min(times);
        let (deep, copies) = repeated(reps, || deep_copy(&cluster));
        drop(copies);
        let (deep_median, deep_min) = median_min(deep);
        notes.push(format!(
            "{n_nodes} nodes: copying the inputs for a compute: {} / {} (median / min); every object copied: {} / {}",
            ms(median),
            ms(min),
            ms(deep_median),
            ms(deep_min)
        ));

        eprintln!("  first compute (no class status)");
        let (first, out) = timed(|| compute(&cluster, &settings));
        if first > TOO_SLOW {
            notes.push(format!(
                "{n_nodes} nodes / {n_maps} PortMaps: one first compute took {:.1} s (over 60 s); stopped there",
                first.as_secs_f64()
            ));
            break;
        }
        with_statuses(&mut cluster, &out);
        drop(out);

        eprintln!("  steady computes");
        let mut steady_times = Vec::new();
        let mut steady = None;
        let cpu0 = cpu_time();
        for _ in 0..reps {
            let (d, o) = timed(|| compute(&cluster, &settings));
            steady_times.push(d);
            steady = Some(o);
        }
        let steady_cpu = cpu_time().saturating_sub(cpu0) / reps as u32;
        let size = format!("{n_nodes} nodes");
        by_change_rows.push(by_change_row(
            &format!("{size}: nothing"),
            median_min(steady_times.clone()),
            by_change(reps, &cluster, &cluster, &settings),
        ));
        let steady = steady.unwrap_or_default();
        let peak = proc_status("VmHWM:").saturating_sub(rss0);
        let before = versions(&steady);
        let max_state = steady.node_states.values().map(|s| s.encoded_len()).max().unwrap_or(0);
        let sum_states: usize = steady.node_states.values().map(|s| s.encoded_len()).sum();
        let states = steady.node_states.values().filter(|s| s.encoded_len() > 0).count();
        let programmed = steady.programming.len();
        let links: usize = steady.classes.values().map(|s| s.links.len()).sum();
        // A cluster whose mappings are refused measures refusals: say why, so it cannot pass unseen.
        if programmed < n_maps * 99 / 100 {
            let mut why: BTreeMap<&str, usize> = BTreeMap::new();
            for c in steady.port_maps.values().flat_map(|s| &s.conditions).filter(|c| c.status != "True") {
                *why.entry(c.reason.as_str()).or_default() += 1;
            }
            notes.push(format!("{n_nodes} nodes: only {programmed} of {n_maps} PortMaps programmed; refusals {why:?}"));
        }

        // One chosen endpoint moves: the pod serving the oldest mapping goes to another node.
        let key = ("team-000".to_string(), "pm-00000".to_string());
        let chosen = steady.port_maps.get(&key).and_then(|s| s.endpoint.clone());
        let mut moved = cluster.clone();
        let target = n_nodes / 2 + 1;
        if let Some(chosen) = &chosen {
            move_pod(&mut moved, "team-000", "pm-00000", &chosen.address, target, &pod_address(target, 250));
        }
        let target = node_name(target);
        let mut change_times = Vec::new();
        let mut after = None;
        for _ in 0..reps {
            let (d, o) = timed(|| compute(&moved, &settings));
            change_times.push(d);
            after = Some(o);
        }
        by_change_rows.push(by_change_row(
            &format!("{size}: one chosen endpoint moved"),
            median_min(change_times.clone()),
            by_change(reps, &cluster, &moved, &settings),
        ));
        let after = after.unwrap_or_default();
        let moved_to = after.port_maps.get(&key).and_then(|s| s.endpoint.as_ref()).map(|e| e.node.clone());
        let changed_nodes = changed(&before, &versions(&after));
        notes.push(format!(
            "{n_nodes} nodes: pm-00000's pod moved {} -> {} (now chosen: {}); changed node states: {changed_nodes}",
            chosen.map(|e| e.node).unwrap_or_default(),
            target,
            moved_to.unwrap_or_default()
        ));
        // The status writer writes the change's statuses back: a compute the hub makes next.
        let mut written = moved.clone();
        with_statuses(&mut written, &after);
        by_change_rows.push(compared(&format!("{size}: its statuses written back"), reps, &moved, &written, &settings));
        drop(written);
        drop(after);
        drop(moved);

        // A PortMap created, the youngest, over links the cluster has; then deleted. Then one
        // that needs links anew, and deleted, which leaves them unused.
        let created = with_one_more(&cluster, false);
        by_change_rows.push(compared(&format!("{size}: a PortMap created"), reps, &cluster, &created, &settings));
        by_change_rows.push(compared(&format!("{size}: that PortMap deleted"), reps, &created, &cluster, &settings));
        let created = with_one_more(&cluster, true);
        let what = format!("{size}: a PortMap created that needs links anew");
        by_change_rows.push(compared(&what, reps, &cluster, &created, &settings));
        // Its statuses and the class rows written back, then it is deleted (its one pod too).
        let mut written = created.clone();
        with_statuses(&mut written, &compute(&created, &settings));
        let mut deleted = written.clone();
        deleted.port_maps.pop();
        deleted.services.pop();
        deleted.endpoint_slices.pop();
        deleted.pods.pop();
        let what = format!("{size}: that PortMap deleted, its links held unused");
        by_change_rows.push(compared(&what, reps, &written, &deleted, &settings));
        drop((created, written, deleted));

        // A standby endpoint (not the chosen one) of another mapping moves.
        let mut standby = cluster.clone();
        let key1 = ("team-001".to_string(), "pm-00001".to_string());
        let chosen1 = steady.port_maps.get(&key1).and_then(|s| s.endpoint.clone()).map(|e| e.address);
        let standby_pod = standby
            .endpoint_slices
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(slice_name("pm-00001").as_str()))
            .and_then(|s| s.endpoints.as_ref())
            .and_then(|eps| eps.iter().find(|e| e.addresses.first() != chosen1.as_ref()))
            .and_then(|e| e.addresses.first().cloned());
        if let Some(address) = standby_pod {
            move_pod(&mut standby, "team-001", "pm-00001", &address, n_nodes - 1, &pod_address(n_nodes - 1, 251));
        }
        let standby_changed = changed(&before, &versions(&compute(&standby, &settings)));
        drop(standby);

        if mesh {
            let members = steady.overlay.values().filter(|o| o.refused.is_empty()).count();
            let peers: usize = steady
                .node_states
                .values()
                .flat_map(|s| &s.netns)
                .flat_map(|ns| &ns.wireguard_devices)
                .map(|d| d.peers.len())
                .sum();
            let mut rekeyed = cluster.clone();
            let who = n_nodes / 2;
            if let Some(f) = rekeyed.facts.get_mut(who) {
                f.wireguard_public_key = Some(test_key(n_nodes + who));
            }
            let (times, out) = repeated(reps, || compute(&rekeyed, &settings));
            by_change_rows.push(by_change_row(
                &format!("{size}: one member's new key"),
                median_min(times.clone()),
                by_change(reps, &cluster, &rekeyed, &settings),
            ));
            drop(rekeyed);
            // One reach report: a member finds its direct path to another broken.
            let mut reported = cluster.clone();
            let (a, b) = (node_name(1), n_nodes / 3);
            let peer_key = reported.facts.get(b).and_then(|f| f.wireguard_public_key.clone()).unwrap_or_default();
            let seen = kuport_controller::observe::ObservedPeer {
                reach: kuport_proto::v1::Reach::Unreachable,
                last_handshake: Some(reported.now),
                endpoint: None,
            };
            std::sync::Arc::make_mut(reported.overlay_observed.reports.entry(a).or_default()).insert(peer_key, seen);
            let (whole, _) = repeated(reps, || compute(&reported, &settings));
            by_change_rows.push(by_change_row(
                &format!("{size}: one reach report"),
                median_min(whole),
                by_change(reps, &cluster, &reported, &settings),
            ));
            drop(reported);
            let (median, min) = median_min(times);
            notes.push(format!(
                "{n_nodes} nodes, mesh: {members} members, {peers} peer entries; {} rekeyed: {} / {} (median / min), changed node states: {}",
                node_name(who),
                ms(median),
                ms(min),
                changed(&before, &versions(&out))
            ));
        }
        if let Some(every) = intercept_every {
            let programmed: u32 = steady.intercepts.values().map(|s| s.programmed_pods).sum();
            let mut relabelled = cluster.clone();
            // Only that pod copied, as a watch cache replaces only it.
            let labelled = relabelled.pods.iter().position(|p| p.metadata.labels.is_some());
            if let Some(pod) = labelled.and_then(|i| relabelled.pods.get_mut(i)) {
                pod.metadata.labels = None;
            }
            let (times, out) = repeated(reps, || compute(&relabelled, &settings));
            by_change_rows.push(by_change_row(
                &format!("{size}: one pod relabelled out of its Intercept"),
                median_min(times.clone()),
                by_change(reps, &cluster, &relabelled, &settings),
            ));
            let (median, min) = median_min(times);
            notes.push(format!(
                "{n_nodes} nodes, Intercepts on one pod in {every}: {programmed} pods programmed; one relabelled out: {} / {} (median / min), changed node states: {}",
                ms(median),
                ms(min),
                changed(&before, &versions(&out))
            ));
        }
        drop(steady);

        if stages_on {
            let t = stages(&cluster);
            let _ =
                writeln!(stage_report, "\nStages at {n_nodes} nodes / {n_maps} PortMaps (steady input, one run):\n");
            let _ = writeln!(stage_report, "| stage | time |\n|---|---:|");
            for (name, d) in &t {
                let _ = writeln!(stage_report, "| {name} | {} |", ms(*d));
            }
            let sum: Duration = t.iter().map(|(_, d)| *d).sum();
            let _ = writeln!(stage_report, "| sum (statuses not included) | {} |", ms(sum));
        }

        rows.push(Row {
            nodes: n_nodes,
            maps: n_maps,
            pods: n_maps * PODS_PER_SERVICE,
            build: build_time,
            first,
            steady: median_min(steady_times),
            steady_cpu,
            change: median_min(change_times),
            changed: changed_nodes,
            standby_changed,
            peak_kib_per_map: peak as f64 / n_maps as f64,
            input_kib_per_map: rss_input as f64 / n_maps as f64,
            max_state,
            sum_states,
            states,
            programmed,
            links,
        });
        drop(cluster);
        eprintln!("  done");
    }

    let mut s = String::new();
    let _ = writeln!(
        s,
        "Machine: {cpus} CPUs; load average (1/5/15 min) {load_start} at start, {} at end. Repetitions: {reps}.",
        loadavg()
    );
    let _ = writeln!(
        s,
        "\n| nodes | PortMaps | pods | programmed | links | build input | first compute (no slots yet) | steady compute median / min | steady compute CPU, mean | after 1 endpoint move median / min | node states changed (chosen pod / standby pod moved) | input RSS KiB/PortMap | peak RSS KiB/PortMap | largest node state | sum of node states (non-empty) |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} / {} | {} / {} | {:.1} | {:.1} | {:.1} KiB | {:.1} MiB ({}) |",
            r.nodes,
            r.maps,
            r.pods,
            r.programmed,
            r.links,
            ms(r.build),
            ms(r.first),
            ms(r.steady.0),
            ms(r.steady.1),
            ms(r.steady_cpu),
            ms(r.change.0),
            ms(r.change.1),
            r.changed,
            r.standby_changed,
            r.input_kib_per_map,
            r.peak_kib_per_map,
            r.max_state as f64 / 1024.0,
            r.sum_states as f64 / (1024.0 * 1024.0),
            r.states,
        );
    }
    if !hwm_resettable {
        let _ = writeln!(s, "\n(VmHWM could not be reset; peak figures after the first size include earlier sizes.)");
    }
    let _ = writeln!(
        s,
        "\nBy change: a Computer that computed the steady input computes the changed one (compute::by_change), beside the whole compute of the changed input.\n"
    );
    let _ = writeln!(
        s,
        "| change | whole compute median / min | by change median / min | redone | node states assembled | node states changed |\n|---|---:|---:|---|---:|---:|"
    );
    for row in &by_change_rows {
        let _ = writeln!(s, "{row}");
    }
    print!("{s}{stage_report}");
    if !notes.is_empty() {
        println!();
        for n in notes {
            println!("- {n}");
        }
    }
}
