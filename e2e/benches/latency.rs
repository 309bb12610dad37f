//! Programming latency (issue 8): from a write to the real API server (a PortMap created, or an
//! EndpointSlice changed) to the DNAT element present in the kernel of every programming node.
//!
//! One default lab on a local API server, two controller replicas and one executor per node, as
//! `kuport-lab up` runs them. Then [`CHANGES`] changes, alternating:
//!
//! - a PortMap create: `apps/lat-K`, TCP 20000+K of the `public` class (docs/portmap/modes.md) to echo-0 (worker-1),
//!   published on edge-a: edge-a's `publish_port` and worker-1's `link_port` must hold it;
//! - an EndpointSlice change: api-0 (PortMap `apps/api`, TCP 9000) moved between worker-2 and
//!   worker-1 by the lab and its new Pod written, then only `apps/api-lab` written: the new node's `link_port` must
//!   translate to the new address and edge-a's `publish_port` must point at that link.
//!
//! t0 is taken right before the write is sent. t1 is when the last programming node's kernel
//! announced the change that made its element present: each node's namespace has a
//! subscription to nf_tables' multicast group (the executor's drift watch), and every
//! announcement is read back at once, so t1 is exact to within a read (printed). A change is
//! prepared (a move's pod moved), then 300 to 600 ms pass, then it is written; the next one is
//! prepared once it landed. The pause lets the facts reports of a move (the pod's veth left one
//! node and appeared on another) reach the leader before the write, as a real pod's veth exists
//! well before its endpoint turns ready; otherwise they start a recompute of their own. The
//! previous change's PortMap status writes are usually over by then, not always (the report
//! counts them). `KUPORT_LATENCY_CHANGES=N` runs N changes.
//!
//! The split (API write, controller, executors) comes from the leader's log line `node states
//! published`; its `status written` lines tell which changes had the leader's own status writes
//! come back as watch events. The controller's recomputes are paced (at once after a quiet
//! spell, then at most every 100 ms: docs/decisions.md, "Recomputes are paced, not
//! debounced"), so a change that follows another within 100 ms waits out the rest.
//!
//! Needs root. `cargo bench -p kuport-lab --bench latency`; everything it starts (namespaces,
//! processes, the API server, its folder) is removed on exit and on panic.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, anyhow, bail};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kuport_controller::api::PortMap;
use kuport_lab::apiserver::{self, ApiServer};
use kuport_lab::plane::{self, KubeSource, PlaneOptions};
use kuport_lab::{Lab, Manifests, Topology};
use kuport_proto::v1::{L4Proto, NftElement, NftFamily, NftTable, NftValue, nft_value};

/// How many changes, half of each kind.
const CHANGES: usize = 200;
/// The first published port of the PortMap creates.
const FIRST_PORT: u16 = 20000;
/// A change that has not landed by then fails the run.
const LAND_TIMEOUT: Duration = Duration::from_secs(15);
/// The goal for the p99.
const GOAL: Duration = Duration::from_millis(250);
/// The nodes watched: the accepting node and the two pod nodes.
const NODES: [&str; 3] = ["edge-a", "worker-1", "worker-2"];
const EDGE: &str = "edge-a";
/// The public interface the accepting node publishes on.
const PUBLIC: &str = "enp1s0";
/// echo-0 on worker-1, the target of every PortMap create.
const ECHO: (&str, Ipv4Addr, u16) = ("worker-1", Ipv4Addr::new(10, 244, 1, 20), 8080);
/// The PortMap the moves act on, and api-0's address on each node.
const API_PORT: u16 = 9000;
const API_ON: [(&str, Ipv4Addr); 2] =
    [("worker-1", Ipv4Addr::new(10, 244, 1, 9)), ("worker-2", Ipv4Addr::new(10, 244, 2, 9))];

/// The manifests: the default lab's (the example classes, game) and a PortMap to api-0.
const API_PORT_MAP: &str = "apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata:
  name: api
  namespace: apps
  creationTimestamp: \"2026-11-01T10:00:00Z\"
spec:
  className: public
  protocol: TCP
  port: 9000
  serviceRef:
    name: api
    port: api
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Create,
    Move,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Create => "PortMap create",
            Kind::Move => "EndpointSlice change",
        }
    }
}

/// What must be in the kernels for a change to have landed: the pod's node translates
/// `port` arriving over its link to `pod`, and the accepting node sends `port` into that link.
#[derive(Debug, Clone, Copy)]
struct Expect {
    pod_node: &'static str,
    port: u16,
    pod: (Ipv4Addr, u16),
}

/// One change, measured.
#[derive(Debug, Clone)]
struct Sample {
    kind: Kind,
    /// t0 on the wall clock, to place the controller's log lines.
    wall: SystemTime,
    /// t0 to the write's answer.
    write: Duration,
    /// t0 to the element present in every programming node's kernel.
    total: Duration,
    /// t0 to the element in the accepting node, and in the pod's node.
    edge: Duration,
    pod_node: Duration,
}

/// One announcement of a node's nf_tables, read back.
struct Seen {
    node: &'static str,
    /// When the announcement arrived.
    at: Instant,
    /// How long reading the table took after it.
    read: Duration,
    table: Option<NftTable>,
}

/// Removes the bench's folder last (it is declared first).
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Stops the API server when dropped, panic or not (its processes are detached).
struct OwnedApiServer(ApiServer);

impl Drop for OwnedApiServer {
    fn drop(&mut self) {
        if let Err(e) = self.0.down() {
            eprintln!("stopping the API server: {e:#}");
        }
    }
}

/// Ends the watch threads when dropped.
struct Stop(Arc<AtomicBool>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn main() {
    if !kuport_lab::sys::is_root() {
        eprintln!("the latency benchmark needs root (network namespaces); not run");
        std::process::exit(1);
    }
    if let Err(e) = run() {
        eprintln!("latency benchmark failed: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("kuport-bench-latency-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _dir = RemoveDir(dir.clone());
    let api = OwnedApiServer(ApiServer::up(&dir.join("controlplane"))?);
    let mut lab = Lab::up(&Topology::default_lab())?;
    let mut options = PlaneOptions::new(env!("CARGO_BIN_EXE_kuport-lab"), &dir);
    let kubeconfig = api.0.kubeconfig.clone();
    options.kubernetes = Some(KubeSource { admin: kubeconfig.clone(), controller: kubeconfig.clone(), replicas: 2 });
    let manifests = Manifests::default_lab().add("api.yaml", API_PORT_MAP)?;
    lab.start_plane(&manifests, options)?;
    let plane = lab.plane().ok_or_else(|| anyhow!("no plane"))?;
    plane.wait_converged(plane::CONVERGE_TIMEOUT)?;
    // The first statuses and class writes settle before the first change.
    std::thread::sleep(Duration::from_secs(2));
    let leader = plane.leader().ok_or_else(|| anyhow!("no replica leads"))?;
    println!(
        "lab {} on a local API server: 2 controller replicas (replica {leader} leads), 3 executors; ready after {:.1} s",
        lab.id(),
        started.elapsed().as_secs_f64()
    );

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client = rt.block_on(apiserver::client(&kubeconfig))?;
    let (tx, rx) = mpsc::channel();
    let stop = Stop(Arc::new(AtomicBool::new(false)));
    let mut netns = Vec::new();
    for node in NODES {
        let path = lab.netns(node)?;
        watch(node, path.clone(), tx.clone(), stop.0.clone())?;
        netns.push((node, path));
    }

    let mut samples = Vec::new();
    let mut reads = Vec::new();
    let mut loads = vec![loadavg()];
    let mut rng = 0x2545_f491_u64;
    let changes = std::env::var("KUPORT_LATENCY_CHANGES").ok().and_then(|n| n.parse().ok()).unwrap_or(CHANGES);
    for i in 0..changes {
        let kind = if i % 2 == 0 { Kind::Create } else { Kind::Move };
        let (expect, write): (Expect, Write) = match kind {
            Kind::Create => {
                let port = FIRST_PORT + (i / 2) as u16;
                (Expect { pod_node: ECHO.0, port, pod: (ECHO.1, ECHO.2) }, Write::PortMap(Box::new(port_map(port)?)))
            }
            Kind::Move => {
                let (node, address) = API_ON[(i / 2) % 2];
                lab.move_pod("api-0", node, address)?;
                let objects = lab.objects();
                // The rescheduled Pod exists, Running at its new address, before the EndpointSlice
                // names it: kuport believes an endpoint only when its Pod vouches for it.
                let pod = objects
                    .pods
                    .iter()
                    .find(|p| p.metadata.name.as_deref() == Some("api-0"))
                    .ok_or_else(|| anyhow!("no Pod apps/api-0"))?;
                let pod = serde_yaml::to_value(pod).context("the Pod as YAML")?;
                rt.block_on(apiserver::sync(&client, &[], &[pod])).context("writing the moved Pod")?;
                let slice = objects
                    .endpoint_slices
                    .into_iter()
                    .find(|s| s.metadata.name.as_deref() == Some("api-lab"))
                    .ok_or_else(|| anyhow!("no EndpointSlice apps/api-lab"))?;
                (Expect { pod_node: node, port: API_PORT, pod: (address, API_PORT) }, Write::Slice(Box::new(slice)))
            }
        };
        // 300 to 600 ms before the write (see the top), varied so the changes keep no phase
        // with periodic work.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_millis(300 + rng % 301));
        let sample = match measure(&rt, &client, &netns, &rx, kind, expect, write, &mut reads) {
            Ok(s) => s,
            Err(e) => {
                let view = lab.plane().map(|p| p.nodes_table().unwrap_or_else(|e| e.to_string())).unwrap_or_default();
                let kept = keep_logs(&dir);
                return Err(e.context(format!("change {i} ({}); the controller's view:\n{view}{kept}", kind.label())));
            }
        };
        samples.push(sample);
        if i == changes / 2 {
            loads.push(loadavg());
        }
    }
    loads.push(loadavg());
    drop(stop);

    let plane = lab.plane().ok_or_else(|| anyhow!("no plane"))?;
    if plane.leader() != Some(leader) {
        println!("note: the leader changed during the run; the split below reads replica {leader}'s log");
    }
    let log = LeaderLog::read(&dir.join(plane::controller_log(leader)))?;
    report(&samples, &log, &reads, &loads, started.elapsed());
    Ok(())
}

/// The write of one change.
enum Write {
    PortMap(Box<PortMap>),
    Slice(Box<EndpointSlice>),
}

/// `apps/lat-PORT`: TCP `port` of the public class to echo's TCP port.
fn port_map(port: u16) -> anyhow::Result<PortMap> {
    let pm = serde_json::json!({
        "apiVersion": "kuport.wlz.li/v1alpha1",
        "kind": "PortMap",
        "metadata": {"name": format!("lat-{port}"), "namespace": "apps"},
        "spec": {"className": "public", "protocol": "TCP", "port": port, "serviceRef": {"name": "echo", "port": "tcp"}},
    });
    Ok(serde_json::from_value(pm)?)
}

/// Sends one write and waits until every programming node's kernel holds its element.
#[allow(clippy::too_many_arguments)]
fn measure(
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    netns: &[(&'static str, PathBuf)],
    rx: &mpsc::Receiver<Seen>,
    kind: Kind,
    expect: Expect,
    write: Write,
    reads: &mut Vec<Duration>,
) -> anyhow::Result<Sample> {
    // The state before: read now, and announcements still in flight dropped.
    let mut latest: Vec<(&'static str, Option<NftTable>)> = Vec::new();
    for (node, path) in netns {
        latest.push((
            *node,
            kuport_node_exec::nft::read_table(Some(path), NftFamily::Inet, kuport_proto::owned::NFT_TABLE)?,
        ));
    }
    while rx.try_recv().is_ok() {}
    if landed(&latest, &expect).is_some() {
        bail!("{expect:?} holds before the write");
    }

    let t0 = Instant::now();
    let wall = SystemTime::now();
    match write {
        Write::PortMap(pm) => {
            let api = Api::<PortMap>::namespaced(client.clone(), "apps");
            rt.block_on(api.create(&PostParams::default(), &*pm)).context("creating the PortMap")?;
        }
        Write::Slice(slice) => {
            let api = Api::<EndpointSlice>::namespaced(client.clone(), "apps");
            let params = PatchParams::apply("kuport-lab").force();
            rt.block_on(api.patch("api-lab", &params, &Patch::Apply(&*slice))).context("writing the EndpointSlice")?;
        }
    }
    let written = t0.elapsed();

    // Every announcement since t0, to find when each node first held its element.
    let mut history: Vec<(&'static str, Instant, NftTable)> = Vec::new();
    let link = loop {
        let left = LAND_TIMEOUT.checked_sub(t0.elapsed()).unwrap_or_default();
        let Ok(seen) = rx.recv_timeout(left) else {
            // Read directly, to tell a change that never landed from a watch that missed it.
            let mut now = Vec::new();
            for (node, path) in netns {
                now.push((
                    *node,
                    kuport_node_exec::nft::read_table(Some(path), NftFamily::Inet, kuport_proto::owned::NFT_TABLE)?,
                ));
            }
            let there = landed(&now, &expect).is_some();
            bail!("{expect:?} not seen in the kernels within {LAND_TIMEOUT:?} (read now: present {there})");
        };
        reads.push(seen.read);
        if let Some(entry) = latest.iter_mut().find(|(n, _)| *n == seen.node) {
            entry.1 = seen.table.clone();
        }
        if seen.at >= t0
            && let Some(table) = seen.table
        {
            history.push((seen.node, seen.at, table));
        }
        if let Some(link) = landed(&latest, &expect) {
            break link;
        }
    };
    let first = |node: &str, holds: &dyn Fn(&NftTable) -> bool| {
        history.iter().find(|(n, _, t)| *n == node && holds(t)).map(|(_, at, _)| at.duration_since(t0))
    };
    let on_pod_node = first(expect.pod_node, &|t| pod_link(t, &expect) == Some(link));
    let on_edge = first(EDGE, &|t| edge_holds(t, &expect, link));
    let (Some(pod_node), Some(edge)) = (on_pod_node, on_edge) else {
        bail!("{expect:?} landed without an announcement after the write");
    };
    Ok(Sample { kind, wall, write: written, total: pod_node.max(edge), edge, pod_node })
}

/// Some(link address) when both nodes hold the change: the pod's node translates the port
/// arriving at its link address to the pod, and the accepting node sends it to that address.
fn landed(latest: &[(&str, Option<NftTable>)], expect: &Expect) -> Option<Ipv4Addr> {
    let table = |node: &str| latest.iter().find(|(n, _)| *n == node).and_then(|(_, t)| t.as_ref());
    let link = pod_link(table(expect.pod_node)?, expect)?;
    edge_holds(table(EDGE)?, expect, link).then_some(link)
}

/// The link address at which the pod's node translates `port` to the pod. `link_port` keys it
/// by the address's stand-in, and `steer_port` maps the link address to that stand-in on the
/// same device (docs/portmap/firewall.md).
fn pod_link(table: &NftTable, expect: &Expect) -> Option<Ipv4Addr> {
    let (device, stand_in) =
        elements(table, kuport_proto::owned::MAP_LINK_PORT).find_map(|e| match (&e.key[..], &e.data[..]) {
            ([dev, me, proto, port], [to, to_port])
                if is_tcp_port(proto, port, expect.port) && is_addr_port(to, to_port, expect.pod) =>
            {
                Some((dev.clone(), addr(me)?))
            }
            _ => None,
        })?;
    elements(table, kuport_controller::compute::portmap::steer::MAP_STEER_PORT).find_map(|e| {
        match (&e.key[..], &e.data[..]) {
            ([dev, link, proto, port], [to])
                if *dev == device && is_tcp_port(proto, port, expect.port) && addr(to) == Some(stand_in) =>
            {
                addr(link)
            }
            _ => None,
        }
    })
}

/// Whether the accepting node sends `port` on its public interface to `link`: `publish_port`
/// keys it by the stand-in that `steer_port` gives the public address (docs/portmap/firewall.md).
fn edge_holds(table: &NftTable, expect: &Expect, link: Ipv4Addr) -> bool {
    let public = |v: &NftValue| matches!(&v.value, Some(nft_value::Value::Ifname(i)) if i == PUBLIC);
    let stand_ins: Vec<Ipv4Addr> = elements(table, kuport_controller::compute::portmap::steer::MAP_STEER_PORT)
        .filter_map(|e| match (&e.key[..], &e.data[..]) {
            ([iface, _, proto, port], [to]) if public(iface) && is_tcp_port(proto, port, expect.port) => addr(to),
            _ => None,
        })
        .collect();
    elements(table, kuport_proto::owned::MAP_PUBLISH_PORT).any(|e| match (&e.key[..], &e.data[..]) {
        ([iface, stand_in, proto, port], [to, to_port]) => {
            public(iface)
                && addr(stand_in).is_some_and(|a| stand_ins.contains(&a))
                && is_tcp_port(proto, port, expect.port)
                && is_addr_port(to, to_port, (link, expect.port))
        }
        _ => false,
    })
}

fn elements<'a>(table: &'a NftTable, set: &str) -> impl Iterator<Item = &'a NftElement> {
    table.sets.iter().filter(move |s| s.name == set).flat_map(|s| &s.elements)
}

fn addr(v: &NftValue) -> Option<Ipv4Addr> {
    match &v.value {
        Some(nft_value::Value::Addr(a)) => a.parse().ok(),
        _ => None,
    }
}

fn port(v: &NftValue) -> Option<u16> {
    match &v.value {
        Some(nft_value::Value::Port(p)) if p.first == p.last => u16::try_from(p.first).ok(),
        _ => None,
    }
}

fn is_tcp_port(proto: &NftValue, p: &NftValue, want: u16) -> bool {
    matches!(proto.value, Some(nft_value::Value::Proto(x)) if x == L4Proto::Tcp as i32) && port(p) == Some(want)
}

fn is_addr_port(a: &NftValue, p: &NftValue, want: (Ipv4Addr, u16)) -> bool {
    addr(a) == Some(want.0) && port(p) == Some(want.1)
}

/// Watches one node's nf_tables: every change its kernel announces is read back at once and
/// sent with the time of the announcement. The thread lives in the node's namespace, so a read
/// needs no namespace switch.
fn watch(node: &'static str, netns: PathBuf, tx: mpsc::Sender<Seen>, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let (ready_tx, ready) = mpsc::channel();
    std::thread::Builder::new().name(format!("watch-{node}")).spawn(move || {
        let watched = kuport_lab::sys::in_netns(&netns.clone(), || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
            let mut sub = kuport_node_exec::nft::watch::subscribe(Some(&netns)).map_err(std::io::Error::other)?;
            let _ = ready_tx.send(Ok(()));
            while !stop.load(Ordering::Relaxed) {
                match rt.block_on(async { tokio::time::timeout(Duration::from_millis(200), sub.recv()).await }) {
                    Err(_) => continue,
                    Ok(None) => return Err(std::io::Error::other("the nftables subscription failed")),
                    Ok(Some(())) => {}
                }
                let at = Instant::now();
                sub.drain();
                let table =
                    match kuport_node_exec::nft::read_table(None, NftFamily::Inet, kuport_proto::owned::NFT_TABLE) {
                        Ok(t) => t,
                        Err(e) => {
                            eprintln!("watch of {node}: reading the table: {e}");
                            continue;
                        }
                    };
                if tx.send(Seen { node, at, read: at.elapsed(), table }).is_err() {
                    break;
                }
            }
            Ok(())
        });
        if let Err(e) = watched {
            eprintln!("watch of {node} ended: {e}");
            let _ = ready_tx.send(Err(anyhow!("watching {node}: {e}")));
        }
    })?;
    ready.recv().map_err(|_| anyhow!("the watch of {node} ended before listening"))?
}

/// What the leader's log says about the run: when it sent nodes new states, and when it wrote a
/// PortMap status (each write comes back as a watch event and restarts the 100 ms of quiet).
struct LeaderLog {
    published: Vec<SystemTime>,
    status_writes: Vec<SystemTime>,
}

impl LeaderLog {
    fn read(log: &Path) -> anyhow::Result<LeaderLog> {
        let text = std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
        let at = |line: &str| {
            let stamp = line.split_whitespace().next()?;
            stamp.parse::<Timestamp>().ok().map(SystemTime::from)
        };
        let lines = |want: &dyn Fn(&str) -> bool| text.lines().filter(|l| want(l)).filter_map(at).collect();
        Ok(LeaderLog {
            // Only the publishes that sent at least one node a state.
            published: lines(&|l| l.contains("node states published") && !l.ends_with("published=0")),
            status_writes: lines(&|l| l.contains("status written portmap=")),
        })
    }
}

/// Copies the processes' logs out of the bench's folder (removed on exit); where, as a line.
fn keep_logs(dir: &Path) -> String {
    let keep = std::env::temp_dir().join(format!("kuport-bench-latency-logs-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&keep);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().ends_with(".log") {
            let _ = std::fs::copy(e.path(), keep.join(e.file_name()));
        }
    }
    format!("\nlogs kept in {}", keep.display())
}

fn loadavg() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// The nearest-rank percentile `p` of sorted values.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// p50, p90, p99 and max of a column, as table cells.
fn cells(values: impl Iterator<Item = Duration>) -> String {
    let mut v: Vec<Duration> = values.collect();
    v.sort();
    if v.is_empty() {
        return "| - | - | - | - |".into();
    }
    let max = *v.last().unwrap_or(&Duration::ZERO);
    format!(
        "| {} | {} | {} | {} |",
        ms(percentile(&v, 50.0)),
        ms(percentile(&v, 90.0)),
        ms(percentile(&v, 99.0)),
        ms(max)
    )
}

fn report(samples: &[Sample], log: &LeaderLog, reads: &[Duration], loads: &[String], took: Duration) {
    // Each change's publish: the first after its t0 (and before the next change's t0).
    let split: Vec<Option<Duration>> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let next = samples.get(i + 1).map(|n| n.wall);
            log.published
                .iter()
                .find(|p| **p >= s.wall && next.is_none_or(|n| **p < n))
                .and_then(|p| p.duration_since(s.wall).ok())
                .filter(|p| *p <= s.total)
        })
        .collect();
    let kinds = [Some(Kind::Create), Some(Kind::Move), None];
    let pick = |k: Option<Kind>| samples.iter().enumerate().filter(move |(_, s)| k.is_none_or(|k| s.kind == k));

    println!("\nprogramming latency, write sent to the DNAT element in every programming node's kernel (ms)\n");
    println!("| changes | n | p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|---|");
    for k in kinds {
        let name = k.map_or("all", Kind::label);
        println!("| {name} | {} {}", pick(k).count(), cells(pick(k).map(|(_, s)| s.total)));
    }

    println!("\nwhere it goes (ms; p50 p90 p99 max)\n");
    println!("| changes | segment | p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|---|");
    for k in kinds {
        let name = k.map_or("all", Kind::label);
        let with_split = || pick(k).filter_map(|(i, s)| split[i].map(|p| (s, p)));
        println!("| {name} | API write (t0 to its answer) {}", cells(pick(k).map(|(_, s)| s.write)));
        println!(
            "| {name} | answer to states published (watch, pace, compute, class status) {}",
            cells(with_split().map(|(s, p)| p.saturating_sub(s.write)))
        );
        println!(
            "| {name} | published to the last kernel (NodeSync, apply) {}",
            cells(with_split().map(|(s, p)| s.total - p))
        );
        println!("| {name} | accepting node (edge-a) {}", cells(pick(k).map(|(_, s)| s.edge)));
        println!("| {name} | pod's node {}", cells(pick(k).map(|(_, s)| s.pod_node)));
    }

    // A PortMap status write between a change's write and its publish comes back as a watch event
    // and restarts the leader's quiet: the changes with and without one.
    let writes_in = |i: usize| {
        let from = samples[i].wall;
        split[i].map(|p| log.status_writes.iter().filter(|w| **w >= from && **w < from + p).count())
    };
    println!("\nby the leader's PortMap status writes between a change's write and its publish (ms)\n");
    println!("| status writes in between | n | p50 | p90 | p99 | max |");
    println!("|---|---|---|---|---|---|");
    for (label, some) in [("none", false), ("one or more", true)] {
        let rows = || samples.iter().enumerate().filter(move |(i, _)| writes_in(*i).is_some_and(|n| (n > 0) == some));
        println!("| {label} | {} {}", rows().count(), cells(rows().map(|(_, s)| s.total)));
    }
    println!(
        "the leader wrote {} PortMap statuses during the {} changes",
        log.status_writes.iter().filter(|w| samples.first().is_some_and(|s| **w >= s.wall)).count(),
        samples.len()
    );

    let matched = split.iter().filter(|s| s.is_some()).count();
    let mut reads = reads.to_vec();
    reads.sort();
    let all: Vec<Duration> = {
        let mut v: Vec<Duration> = samples.iter().map(|s| s.total).collect();
        v.sort();
        v
    };
    let p99 = percentile(&all, 99.0);
    println!(
        "\n{} changes in {:.0} s; {matched} matched to a `node states published` line of the leader's log; \
         the controller paces its recomputes at most every 100 ms",
        samples.len(),
        took.as_secs_f64()
    );
    if !reads.is_empty() {
        println!(
            "resolution: the kernel's nf_tables announcements, each read back in {} ms (p50), {} ms (max), {} reads",
            ms(percentile(&reads, 50.0)),
            ms(*reads.last().unwrap_or(&Duration::ZERO)),
            reads.len()
        );
    }
    println!("load average (1 5 15 min): start {}", loads.join(", then "));
    println!("goal p99 < {} ms: {} (p99 {} ms)", GOAL.as_millis(), if p99 < GOAL { "met" } else { "not met" }, ms(p99));
}
