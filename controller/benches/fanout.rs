//! Fan-out benchmark (issue 8): one controller, many simulated executors on loopback.
//!
//! Run with `cargo bench -p kuport-controller --bench fanout` (release profile). Prints markdown
//! tables. KUPORT_BENCH_SIZES picks clusters as `nodes:PortMaps`, comma-separated (default
//! `100:5000,1000:5000,1000:10000`); KUPORT_BENCH_CHANGES sets the changes per cluster (default
//! 200).
//!
//! Per cluster (the same synthetic cluster as benches/compute.rs: ten edge nodes, four Vxlan
//! classes, one Service with three pods on random nodes per PortMap), in one process:
//! - the controller's own pieces run as `run_standalone` wires them: a [`Hub`] (statuses fed
//!   back), its paced `recompute_loop` and `serve_grpc` on 127.0.0.1;
//! - one tonic client per node, each on its own HTTP/2 connection, says Hello (no facts: the
//!   cluster's facts stand in) and acks every DesiredState at once without applying it;
//! - once every executor acked its first state, the changes go in one at a time through
//!   `Hub::set_inputs` (what the folder and Kubernetes sources call), cycling through: a PortMap
//!   (with its Service and EndpointSlice) is created, the chosen pod of a random PortMap moves
//!   to another node, the PortMap created before is deleted. Each comes after a quiet spell of
//!   two paces (`hub::PACE`), once the statuses the last one fed back were computed: what is
//!   measured is a change's own latency (changes in a burst share one compute per pace).
//!
//! Measured per change: from `set_inputs` to the moment the hub holds the ACK of every node
//! whose state the change republished (the bench waits on `Hub::status_dirty`, which every
//! publish and ACK notifies); how many nodes received a state and the DesiredState bytes they
//! received (prost `encoded_len`, as decoded by the clients). A tracing layer timestamps the
//! hub's "computed" (with its elapsed_ms) and "node states published" log events, which splits
//! the time into wait (to compute start), compute, publish (from compute end to the
//! publish log: the recompute loop resuming, every node state versioned, the changed ones sent)
//! and delivery (to the last ACK). The bench relies on those two log events: if they change,
//! changes show as timed out.

/// The controller's allocator (its `main.rs`), so the benchmark measures what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/machine.rs"]
mod machine;
use cluster::*;
use machine::loadavg;

use kuport_controller::api::Protocol;
use kuport_controller::compute::Settings;
use kuport_controller::observe::Cluster;
use kuport_controller::serve::{MAX_MESSAGE, serve_grpc};
use kuport_controller::stream::{Hub, leader};
use kuport_proto::v1::node_sync_client::NodeSyncClient;
use kuport_proto::v1::{Ack, ExecutorMessage, Hello, controller_message, executor_message};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer, filter::Targets};

const DEFAULT_SIZES: [(usize, usize); 3] = [(100, 5_000), (1_000, 5_000), (1_000, 10_000)];
const DEFAULT_CHANGES: usize = 200;
/// A change whose ACKs take longer than this is reported as lost and the cluster stops.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long all executors may take to connect and ack their first state.
const SYNC_TIMEOUT: Duration = Duration::from_secs(600);

/// Pods of the PortMaps the benchmark creates.

// ---- The changes ----

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Create,
    Move,
    Delete,
}

impl Kind {
    const CYCLE: [Kind; 3] = [Kind::Create, Kind::Move, Kind::Delete];
    fn label(self) -> &'static str {
        match self {
            Kind::Create => "PortMap created",
            Kind::Move => "chosen pod moved",
            Kind::Delete => "PortMap deleted",
        }
    }
}

/// Applies change `k` of `kind` to `c`; `chosen` is the last published endpoint of a PortMap.
fn change(
    c: &mut Cluster,
    kind: Kind,
    k: usize,
    n_nodes: usize,
    rng: &mut Rng,
    chosen: impl Fn(&str, &str) -> Option<(String, String)>,
) {
    match kind {
        Kind::Create => {
            let ns = format!("team-{:03}", k % NAMESPACES);
            // Addresses from the top of each node's pod range, clear of the built cluster's.
            let pods = (0..PODS_PER_SERVICE)
                .map(|p| {
                    let node = rng.below(n_nodes);
                    (pod_address(node, 128 + (k * PODS_PER_SERVICE + p) % 120), node_name(node))
                })
                .collect();
            add_mapping(
                c,
                Mapping {
                    name: format!("new-{k:05}"),
                    ns,
                    class: CLASSES[(k / 3) % CLASSES.len()].0,
                    protocol: Protocol::Tcp,
                    port: 40_000 + (k % 20_000) as u16,
                    end_port: None,
                    pod_port: 8_080,
                    pods,
                    created: 1_800_000_000 + k as i64,
                },
            );
        }
        Kind::Delete => {
            let name = c.port_maps.last().and_then(|p| p.metadata.name.clone()).unwrap_or_default();
            if name.starts_with("new-") {
                c.port_maps.pop();
                c.services.pop();
                c.endpoint_slices.pop();
            }
        }
        Kind::Move => {
            // A programmed PortMap, picked at random; its chosen pod goes to another node.
            for _ in 0..100 {
                let i = rng.below(c.port_maps.len());
                let pm = &c.port_maps[i];
                let (ns, name) = (pm.metadata.namespace.clone().unwrap_or_default(), pm.metadata.name.clone());
                let Some((address, node)) = chosen(&ns, name.as_deref().unwrap_or_default()) else { continue };
                let mut target = rng.below(n_nodes);
                while node_name(target) == node {
                    target = rng.below(n_nodes);
                }
                let to = pod_address(target, 128 + k % 120);
                move_pod(c, &ns, &name.unwrap_or_default(), &address, target, &to);
                return;
            }
        }
    }
}

// ---- Observing the hub and the clients ----

/// One DesiredState as a simulated executor received it.
struct Received {
    sequence: u64,
    bytes: usize,
}

type Log = Arc<Mutex<Vec<Received>>>;

/// The hub's compute and publish events, timestamped as they happen.
#[derive(Default)]
struct HubEvents {
    /// (when compute_now started, when it ended, how the port maps were made); the start is the
    /// end minus elapsed_ms, so compute times have millisecond resolution.
    computed: Vec<Computed>,
    /// (when, how many states were published)
    published: Vec<(Instant, u64)>,
}

/// A tracing layer recording [`HubEvents`]: the hub logs "computed" with elapsed_ms (debug)
/// and "node states published" with the count (info); nothing else is needed from it.
struct Capture(Arc<Mutex<HubEvents>>);

#[derive(Default)]
struct Fields {
    message: String,
    elapsed_ms: Option<u64>,
    published: Option<u64>,
    port_maps: Way,
}

/// A compute: when it started and ended, and how it made the port maps.
type Computed = (Instant, Instant, Way);

/// How a compute made the port maps (the hub's `port_maps` field of "computed").
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
enum Way {
    #[default]
    Kept,
    Patched,
    Whole,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "port_maps" {
            self.port_maps = match value {
                "patched" => Way::Patched,
                "whole" => Way::Whole,
                _ => Way::Kept,
            };
        }
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        match field.name() {
            "elapsed_ms" => self.elapsed_ms = Some(value),
            "published" => self.published = Some(value),
            _ => {}
        }
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.record_u64(field, value.max(0) as u64);
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let at = Instant::now();
        let mut f = Fields::default();
        event.record(&mut f);
        let mut e = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match (f.message.as_str(), f.elapsed_ms, f.published) {
            ("computed", Some(ms), _) => e.computed.push((at - Duration::from_millis(ms), at, f.port_maps)),
            ("node states published", _, Some(n)) => e.published.push((at, n)),
            _ => {}
        }
    }
}

/// A simulated executor: Hello, then an immediate ok Ack for every state, applying nothing.
/// Like the real one, it reconnects when its stream fails; `failures` counts those.
async fn executor(address: String, node: String, log: Log, failures: Arc<AtomicUsize>) {
    loop {
        if let Err(e) = session(&address, &node, &log).await
            && failures.fetch_add(1, Ordering::Relaxed) < 5
        {
            eprintln!("{node}: {e}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn session(address: &str, node: &str, log: &Log) -> Result<(), String> {
    let client = NodeSyncClient::connect(address.to_string()).await.map_err(|e| format!("connect: {e}"))?;
    let mut client = client.max_decoding_message_size(MAX_MESSAGE);
    let (tx, rx) = mpsc::channel(4);
    let hello = Hello { node: node.to_string(), executor_version: "fanout-bench".into(), applied: None };
    let _ = tx.send(ExecutorMessage { message: Some(executor_message::Message::Hello(hello)) }).await;
    let response = client.sync(ReceiverStream::new(rx)).await.map_err(|e| format!("sync: {e}"))?;
    let mut inbound = response.into_inner();
    loop {
        let m = inbound.message().await.map_err(|e| format!("stream: {e}"))?.ok_or("stream ended")?;
        let Some(controller_message::Message::State(ds)) = m.message else { continue };
        lock(log).push(Received { sequence: ds.sequence, bytes: ds.encoded_len() });
        let ack = Ack { term: ds.term, sequence: ds.sequence, version: ds.version, ok: true, errors: vec![] };
        tx.send(ExecutorMessage { message: Some(executor_message::Message::Ack(ack)) })
            .await
            .map_err(|_| "stream closed")?;
    }
}

/// The highest sequence any node's desired state carries.
fn last_sequence(hub: &Hub) -> u64 {
    hub.nodes().iter().filter_map(|n| n.desired.as_ref().map(|d| d.sequence)).max().unwrap_or(0)
}

/// What one change took, as the hub and its events show it.
struct Settled {
    /// When the hub held the last ACK (the publish, when no node got a state).
    done: Instant,
    /// How many nodes were sent a state.
    nodes: usize,
    /// The compute that read the change: (start, end, how it made the port maps).
    computed: Computed,
    /// When that compute's states were published, and how many.
    published: (Instant, u64),
}

/// The first publish of a compute that started after `after`.
fn publish_after(e: &HubEvents, after: Instant) -> Option<(Computed, (Instant, u64))> {
    let c = *e.computed.iter().find(|c| c.0 >= after)?;
    let p = *e.published.iter().find(|p| p.0 >= c.1)?;
    Some((c, p))
}

/// Waits for the publish of the compute that read a change made at `changed`, then for the
/// ACK of every node it sent a state to (sequence above `seq_before`). None on timeout.
async fn settle(
    hub: &Hub,
    events: &Mutex<HubEvents>,
    changed: Instant,
    seq_before: u64,
    deadline: Instant,
) -> Option<Settled> {
    // A compute that started before the change (one already under way) read the previous
    // inputs; its start is taken from its whole milliseconds, so never before the real one.
    let after = changed;
    let (computed, published) = loop {
        if let Some(found) = publish_after(&lock(events), after) {
            break found;
        }
        if Instant::now() >= deadline {
            return None;
        }
        // A publish notifies status_dirty just before it logs; poll briefly as well.
        let _ = tokio::time::timeout(Duration::from_millis(2), hub.status_dirty()).await;
    };
    let affected: Vec<(String, u64)> = hub
        .nodes()
        .into_iter()
        .filter_map(|n| n.desired.as_ref().filter(|d| d.sequence > seq_before).map(|d| (n.node.clone(), d.sequence)))
        .collect();
    let nodes = affected.len();
    if affected.is_empty() {
        return Some(Settled { done: published.0, nodes, computed, published });
    }
    // Every ACK notifies status_dirty; a notification without a waiter is kept, so checking
    // before waiting loses none.
    loop {
        let done =
            affected.iter().all(|(n, seq)| hub.node(n).and_then(|v| v.acked).is_some_and(|a| a.sequence >= *seq));
        if done {
            return Some(Settled { done: Instant::now(), nodes, computed, published });
        }
        tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), hub.status_dirty()).await.ok()?;
    }
}

// ---- One cluster ----

struct Sample {
    kind: Kind,
    /// set_inputs to the hub holding the last ACK.
    total: Duration,
    /// set_inputs to compute start: the recompute task waking (and the pace, if one is due).
    wait: Duration,
    compute: Duration,
    way: Way,
    /// compute end to the publish event (versions of every node state, the sends).
    publish: Duration,
    /// publish event to the last ACK.
    delivery: Duration,
    nodes: usize,
    messages: usize,
    bytes: usize,
}

struct Run {
    nodes: usize,
    maps: usize,
    sync: Duration,
    all_states_bytes: usize,
    non_empty_states: usize,
    /// Cloning, and versioning, every node state once, as each publish does.
    versioning: (Duration, Duration),
    /// Executor streams that failed (and reconnected) while connecting, and during the changes.
    setup_failures: usize,
    change_failures: usize,
    idle_published: Vec<u64>,
    samples: Vec<Sample>,
    notes: Vec<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn run(n_nodes: usize, n_maps: usize, changes: usize, events: Arc<Mutex<HubEvents>>) -> Run {
    let mut rng = Rng(42);
    let mut cluster = build(n_nodes, n_maps, &mut rng);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
    let address = listener.local_addr().expect("local address");
    // The sender must live: the recompute loop ends when leadership can no longer change.
    let (_lead_tx, lead_rx) = leader::standalone(address.to_string());
    let hub = Hub::new(Settings::default(), lead_rx, true);
    hub.set_inputs(cluster.clone());
    let recompute = tokio::spawn(hub.clone().recompute_loop(None));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_grpc(hub.clone(), listener, Default::default(), async {
        let _ = stop_rx.await;
    }));
    let mut notes = Vec::new();

    // Connect every executor, one connection each, and wait until all acked a first state.
    let log: Log = Arc::default();
    let failures = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut clients = Vec::new();
    for i in 0..n_nodes {
        let (address, log, failures) = (format!("http://{address}"), log.clone(), failures.clone());
        clients.push(tokio::spawn(executor(address, node_name(i), log, failures)));
    }
    let deadline = started + SYNC_TIMEOUT;
    loop {
        let nodes = hub.nodes();
        let synced = nodes
            .iter()
            .filter(|n| {
                n.connected && n.desired.as_ref().zip(n.acked.as_ref()).is_some_and(|(d, a)| a.sequence >= d.sequence)
            })
            .count();
        if synced == n_nodes && nodes.len() == n_nodes {
            break;
        }
        assert!(Instant::now() < deadline, "only {synced} of {n_nodes} executors synced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sync = started.elapsed();
    let setup_failures = failures.load(Ordering::Relaxed);

    // Settle: recompute without a change until nothing is republished (slots, statuses fed back).
    let mut idle_published = Vec::new();
    for _ in 0..3 {
        let (seq, t) = (last_sequence(&hub), Instant::now());
        hub.request_recompute();
        let n = settle(&hub, &events, t, seq, t + CHANGE_TIMEOUT).await.expect("idle recompute").published.1;
        idle_published.push(n);
        if n == 0 {
            break;
        }
    }
    let (outputs, _) = hub.outputs();
    let all_states_bytes = outputs.node_states.values().map(|s| s.encoded_len()).sum();
    let non_empty_states = outputs.node_states.values().filter(|s| s.encoded_len() > 0).count();
    // What every publish does for every node before it knows whether the state changed.
    let t = Instant::now();
    std::hint::black_box(outputs.node_states.values().cloned().collect::<Vec<_>>());
    let cloning = t.elapsed();
    let t = Instant::now();
    for state in outputs.node_states.values() {
        std::hint::black_box(kuport_proto::canonical_version(state));
    }
    let versioning = (cloning, t.elapsed());
    drop(outputs);

    let mut samples = Vec::new();
    for k in 0..changes {
        tokio::time::sleep(2 * kuport_controller::stream::hub::PACE).await;
        let kind = Kind::CYCLE[k % Kind::CYCLE.len()];
        let (outputs, _) = hub.outputs();
        let chosen = |ns: &str, name: &str| {
            let e = outputs.port_maps.get(&(ns.to_string(), name.to_string()))?.endpoint.as_ref()?;
            Some((e.address.clone(), e.node.clone()))
        };
        change(&mut cluster, kind, k, n_nodes, &mut rng, chosen);
        drop(outputs);
        let next = cluster.clone();
        let seq = last_sequence(&hub);
        {
            lock(&log).clear();
            let mut e = lock(&events);
            e.computed.clear();
            e.published.clear();
        }
        let t0 = Instant::now();
        hub.set_inputs(next);
        let Some(settled) = settle(&hub, &events, t0, seq, t0 + CHANGE_TIMEOUT).await else {
            notes.push(format!(
                "change {k} ({}): no publish (log event) or not every ACK within {CHANGE_TIMEOUT:?}; stopped",
                kind.label()
            ));
            break;
        };
        let (messages, bytes) = {
            let log = lock(&log);
            let mine: Vec<&Received> = log.iter().filter(|r| r.sequence > seq).collect();
            (mine.len(), mine.iter().map(|r| r.bytes).sum())
        };
        let computes = lock(&events).computed.len();
        if computes != 1 {
            notes.push(format!("change {k} ({}): {computes} computes ran", kind.label()));
        }
        let Settled { done, nodes, computed: (c_start, c_end, way), published: (p_at, _) } = settled;
        samples.push(Sample {
            kind,
            total: done - t0,
            wait: c_start.saturating_duration_since(t0),
            compute: c_end - c_start,
            way,
            publish: p_at.saturating_duration_since(c_end),
            delivery: done.saturating_duration_since(p_at),
            nodes,
            messages,
            bytes,
        });
    }

    let change_failures = failures.load(Ordering::Relaxed) - setup_failures;
    for c in clients {
        c.abort();
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    recompute.abort();
    Run {
        nodes: n_nodes,
        maps: n_maps,
        sync,
        all_states_bytes,
        non_empty_states,
        versioning,
        idle_published,
        setup_failures,
        change_failures,
        samples,
        notes,
    }
}

// ---- Report ----

/// Nearest-rank percentile of sorted values.
fn pct<T: Copy>(sorted: &[T], p: f64) -> T {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms >= 100.0 { format!("{ms:.0}") } else { format!("{ms:.1}") }
}

fn kib(b: usize) -> String {
    format!("{:.1}", b as f64 / 1024.0)
}

fn row(out: &mut String, r: &Run, label: &str, samples: &[&Sample]) {
    if samples.is_empty() {
        return;
    }
    let sorted = |f: &dyn Fn(&Sample) -> Duration| {
        let mut v: Vec<Duration> = samples.iter().map(|s| f(s)).collect();
        v.sort();
        v
    };
    let p50_p99 = |f: &dyn Fn(&Sample) -> Duration| {
        let v = sorted(f);
        format!("{} / {}", ms(pct(&v, 0.5)), ms(pct(&v, 0.99)))
    };
    let mut nodes: Vec<usize> = samples.iter().map(|s| s.nodes).collect();
    nodes.sort();
    let mut bytes: Vec<usize> = samples.iter().map(|s| s.bytes).collect();
    bytes.sort();
    let mean_nodes = nodes.iter().sum::<usize>() as f64 / nodes.len() as f64;
    let per_node = bytes.iter().sum::<usize>() as f64 / nodes.iter().sum::<usize>().max(1) as f64 / 1024.0;
    let _ = writeln!(
        out,
        "| {} | {} | {label} | {} | {mean_nodes:.1} ({}-{}) | {} / {} | {per_node:.1} | {} | {} | {} | {} | {} | {} |",
        r.nodes,
        r.maps,
        samples.len(),
        nodes[0],
        nodes[nodes.len() - 1],
        kib(pct(&bytes, 0.5)),
        kib(bytes[bytes.len() - 1]),
        p50_p99(&|s| s.total),
        p50_p99(&|s| s.total - s.wait),
        p50_p99(&|s| s.wait),
        p50_p99(&|s| s.compute),
        p50_p99(&|s| s.publish),
        p50_p99(&|s| s.delivery),
    );
}

fn main() {
    let sizes: Vec<(usize, usize)> = match std::env::var("KUPORT_BENCH_SIZES") {
        Err(_) => DEFAULT_SIZES.to_vec(),
        Ok(v) => v
            .split(',')
            .filter_map(|s| {
                let s = s.trim().replace('_', "");
                let (n, m) = s.split_once(':').unwrap_or((&s, ""));
                let n: usize = n.parse().ok()?;
                Some((n, m.parse().unwrap_or(n * 5)))
            })
            .collect(),
    };
    let changes: usize =
        std::env::var("KUPORT_BENCH_CHANGES").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_CHANGES).max(1);
    let events = Arc::new(Mutex::new(HubEvents::default()));
    tracing_subscriber::registry()
        .with(
            Capture(events.clone())
                .with_filter(Targets::new().with_target("kuport_controller::stream::hub", tracing::Level::DEBUG)),
        )
        .init();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mut loads = vec![loadavg()];
    let mut runs = Vec::new();
    for (n_nodes, n_maps) in sizes {
        eprintln!("{n_nodes} nodes, {n_maps} PortMaps, {changes} changes");
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
        let r = rt.block_on(run(n_nodes, n_maps, changes, events.clone()));
        rt.shutdown_timeout(Duration::from_secs(5));
        loads.push(loadavg());
        eprintln!("  done: {} changes measured, load {}", r.samples.len(), loads.last().map_or("", |s| s));
        runs.push(r);
    }

    let mut s = String::new();
    let _ = writeln!(
        s,
        "Machine: {cpus} CPUs, kernel {}; load average (1/5/15 min) at start and after each cluster: {}. \
         Changes per cluster: {changes}. Percentiles: nearest rank.\n",
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        loads.join("; ")
    );
    let _ = writeln!(
        s,
        "| nodes | PortMaps | executors connect and ack a first state | nodes with a non-empty state | all node states (what a broadcast would send) | clone / version every node state (each publish does both) | executor streams failed (reconnected): setup / changes | idle recomputes: states republished |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in &runs {
        let _ = writeln!(
            s,
            "| {} | {} | {} ms | {} | {} KiB | {} / {} ms | {} / {} | {:?} |",
            r.nodes,
            r.maps,
            ms(r.sync),
            r.non_empty_states,
            kib(r.all_states_bytes),
            ms(r.versioning.0),
            ms(r.versioning.1),
            r.setup_failures,
            r.change_failures,
            r.idle_published
        );
    }
    let _ = writeln!(
        s,
        "\n| nodes | PortMaps | change | n | nodes sent a state: mean (min-max) | DesiredState KiB per change: median / max | KiB per node sent | **change to last ACK** ms p50 / p99 | compute start to last ACK | wait | compute | publish | delivery |"
    );
    let _ = writeln!(s, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &runs {
        for kind in Kind::CYCLE {
            let of: Vec<&Sample> = r.samples.iter().filter(|x| x.kind == kind).collect();
            row(&mut s, r, kind.label(), &of);
        }
        let all: Vec<&Sample> = r.samples.iter().collect();
        row(&mut s, r, "**all**", &all);
        for (way, label) in [(Way::Patched, "all, port maps patched"), (Way::Whole, "all, port maps whole")] {
            let of: Vec<&Sample> = r.samples.iter().filter(|x| x.way == way).collect();
            row(&mut s, r, label, &of);
        }
    }
    print!("{s}");
    let mut notes: Vec<String> = Vec::new();
    for r in &runs {
        let mismatched = r.samples.iter().filter(|x| x.messages != x.nodes).count();
        if mismatched > 0 {
            notes.push(format!(
                "{} nodes: {mismatched} changes where the clients received a different number of states than nodes were sent one (coalesced or late)",
                r.nodes
            ));
        }
        notes.extend(r.notes.iter().map(|n| format!("{} nodes / {} PortMaps: {n}", r.nodes, r.maps)));
    }
    if !notes.is_empty() {
        println!();
        for n in notes {
            println!("- {n}");
        }
    }
}
