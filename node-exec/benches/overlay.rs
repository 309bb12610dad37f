//! The overlay against the bare underlay (issue 16, docs/performance.md "Overlay"): TCP
//! throughput (iperf3) and UDP round trips between a pod on one node and a pod on another, over
//! kuport's WireGuard mesh as the controller computes it and the executor applies it
//! (wireguard-go: this kernel has no WireGuard module), and over the same underlay with plain
//! routes to the peer's pod CIDR, as a host-gw CNI would route it.
//!
//! Run as root: `cargo bench -p kuport-node-exec --bench overlay` (needs iperf3 and python3).
//! KUPORT_BENCH_ROUNDS (default 7) rounds; each measures both paths, alternating which goes
//! first, because the machine is shared and noisy: the ratios are taken within a round.
//! KUPORT_BENCH_SECS per iperf3 run (3, after 1 s omitted for slow start).
//!
//! Both nodes and both pods share this machine's cores, so the figures compare the CPU each path
//! costs per byte here, not a network: wireguard-go encrypts in user space, one crossing of a
//! tun device each way.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{BenchResult, run};
use kuport_controller::compute::overlay::OverlaySettings;
use kuport_controller::compute::{Settings, compute, testkit};
use kuport_controller::observe::{Cluster, KnownFacts};
use kuport_node_exec::executor::Executor;
use kuport_node_exec::wireguard::{Options, Wireguard};
use kuport_proto::v1::NetnsState;

const UNDERLAY_MTU: u32 = 1500;
const DEVICE: &str = "kup-wgb";
const LISTEN_PORT: u16 = 51820;
const ECHO_PORT: u16 = 7777;
const IPERF_PORT: u16 = 5201;
const ROUND_TRIPS: usize = 2000;
const ECHO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/overlay_echo.py");
/// Sequential 32-byte UDP requests to the echo server; prints the median and 99th percentile
/// round trip in microseconds.
const RTT_CLIENT: &str = r#"
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.0)
s.connect((host, port))
times = []
for _ in range(n):
    t = time.perf_counter_ns()
    s.send(b"x" * 32)
    s.recv(256)
    times.append((time.perf_counter_ns() - t) / 1000)
times.sort()
print("%.1f %.1f" % (times[len(times) // 2], times[len(times) * 99 // 100]))
"#;

fn unique() -> usize {
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

/// A scratch namespace; its processes are ended and it is deleted on drop.
struct Netns(String);

impl Netns {
    fn new(what: &str) -> BenchResult<Self> {
        let name = format!("kuport-ovb-{}-{}-{what}", std::process::id(), unique());
        run(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Netns(name);
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    fn ip(&self, args: &[&str]) -> BenchResult<String> {
        run(Command::new("ip").args(["-n", &self.0]).args(args))
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0]).args(args);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let pids = || run(Command::new("ip").args(["netns", "pids", &self.0])).unwrap_or_default();
        for pid in pids().split_whitespace() {
            let _ = Command::new("kill").arg(pid).status();
        }
        let start = Instant::now();
        while !pids().trim().is_empty() && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(20));
        }
        for pid in pids().split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A node: its namespace, its pod's, its folder (key, wireguard-go's private socket folder)
/// and its WireGuard. Drops the pod, then the node (its daemon), then the folder.
struct Node {
    index: u8,
    pod: Netns,
    ns: Netns,
    dir: std::path::PathBuf,
    wg: Arc<Wireguard>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Node {
    fn new(index: u8, underlay: &Netns) -> BenchResult<Node> {
        let dir = std::env::temp_dir().join(format!("kuport-ovb-{}-{}-{index}", std::process::id(), unique()));
        let sockets = dir.join("sockets");
        std::fs::create_dir_all(&sockets).map_err(|e| format!("{}: {e}", sockets.display()))?;
        // wireguard-go's socket folder is fixed: give each node's daemon its own.
        let wrapper = dir.join("wireguard-go");
        let script = format!(
            "#!/bin/sh\nexec unshare --mount --propagation private sh -c 'mkdir -p /var/run/wireguard && mount --bind \"$0\" /var/run/wireguard && exec wireguard-go \"$@\"' {} \"$@\"\n",
            sockets.display()
        );
        std::fs::write(&wrapper, script).map_err(|e| format!("{}: {e}", wrapper.display()))?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
        let options = Options { wireguard_go: wrapper, socket_dir: sockets, ..Options::default() };
        let wg = Arc::new(Wireguard::load(&dir, options).map_err(|e| e.to_string())?);
        let node =
            Node { index, pod: Netns::new(&format!("{index}-pod"))?, ns: Netns::new(&index.to_string())?, dir, wg };
        let (mtu, port) = (UNDERLAY_MTU.to_string(), format!("n{index}"));
        run(Command::new("ip")
            .args(["link", "add", "eth0", "netns", &node.ns.0, "type", "veth", "peer", "name"])
            .args([&port, "netns", &underlay.0]))?;
        underlay.ip(&["link", "set", &port, "master", "br0", "mtu", &mtu, "up"])?;
        node.ns.ip(&["link", "set", "eth0", "mtu", &mtu, "up"])?;
        node.ns.ip(&["addr", "add", &format!("{}/24", node.underlay()), "dev", "eth0"])?;
        // The pod, as the bridge CNI with host-local IPAM makes it: .1 on the node, .2 the pod.
        run(Command::new("ip")
            .args(["link", "add", "pod0", "netns", &node.ns.0, "type", "veth", "peer", "name"])
            .args(["eth0", "netns", &node.pod.0]))?;
        node.ns.ip(&["addr", "add", &format!("10.42.{index}.1/24"), "dev", "pod0"])?;
        node.ns.ip(&["link", "set", "pod0", "up"])?;
        node.pod.ip(&["addr", "add", &format!("{}/24", node.pod_address()), "dev", "eth0"])?;
        node.pod.ip(&["link", "set", "eth0", "up"])?;
        node.pod.ip(&["route", "add", "default", "via", &format!("10.42.{index}.1")])?;
        Ok(node)
    }

    fn underlay(&self) -> String {
        format!("192.168.78.{}", self.index)
    }

    fn pod_address(&self) -> String {
        format!("10.42.{}.2", self.index)
    }

    fn pod_cidr(&self) -> String {
        format!("10.42.{}.0/24", self.index)
    }

    fn executor(&self) -> Executor {
        Executor::new(Some(std::path::PathBuf::from(format!("/var/run/netns/{}", self.ns.0))))
            .with_wireguard(Arc::clone(&self.wg))
    }
}

/// The two nodes as the controller sees them, and each one's host namespace as computed.
fn states(nodes: &[Node]) -> BenchResult<Vec<NetnsState>> {
    let mut c = Cluster { now: testkit::now(), ..Default::default() };
    for n in nodes {
        let node = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": format!("node-{}", n.index)},
            "spec": {"podCIDRs": [n.pod_cidr()]},
            "status": {"addresses": [{"type": "InternalIP", "address": n.underlay()}]},
        });
        c.nodes.push(serde_json::from_value(node).map_err(|e| e.to_string())?);
        c.facts.push(KnownFacts {
            node: format!("node-{}", n.index),
            underlay_address: None,
            underlay_mtu: Some(UNDERLAY_MTU),
            interfaces: None,
            wireguard_public_key: Some(n.wg.public_key().to_string()),
            ..Default::default()
        });
    }
    let overlay = OverlaySettings::new(DEVICE, LISTEN_PORT).map_err(|e| e.to_string())?;
    let out = compute(&c, &Settings { overlay: Some(overlay) });
    nodes
        .iter()
        .map(|n| {
            let state = out.node_states.get(&format!("node-{}", n.index)).ok_or("no state")?;
            state.netns.iter().find(|ns| ns.target.is_none()).cloned().ok_or_else(|| "no host namespace".to_string())
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Path {
    Mesh,
    Underlay,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Mesh => "over the mesh (kup-wgb, wireguard-go)",
            Path::Underlay => "over the bare underlay (routes via eth0)",
        }
    }
}

struct Bench {
    nodes: Vec<Node>,
    _executors: Vec<Executor>,
    _servers: Vec<Proc>,
    _underlay: Netns,
}

impl Bench {
    fn new() -> BenchResult<Bench> {
        let underlay = Netns::new("ul")?;
        underlay.ip(&["link", "add", "br0", "type", "bridge"])?;
        underlay.ip(&["link", "set", "br0", "up"])?;
        let nodes = vec![Node::new(1, &underlay)?, Node::new(2, &underlay)?];
        let states = states(&nodes)?;
        let mut executors: Vec<Executor> = nodes.iter().map(Node::executor).collect();
        for (ex, s) in executors.iter_mut().zip(&states) {
            ex.apply(s).map_err(|e| format!("apply: {e}"))?;
        }
        // The executors are kept (their devices stay); nothing here changes kuport's state.
        let mut servers = Vec::new();
        let echo =
            nodes[1].pod.command(&["python3", ECHO, "serve", &ECHO_PORT.to_string()]).stdout(Stdio::null()).spawn();
        servers.push(Proc(echo.map_err(|e| e.to_string())?));
        let iperf =
            nodes[1].pod.command(&["iperf3", "-s", "-p", &IPERF_PORT.to_string()]).stdout(Stdio::null()).spawn();
        servers.push(Proc(iperf.map_err(|e| e.to_string())?));
        std::thread::sleep(Duration::from_millis(500));
        Ok(Bench { nodes, _executors: executors, _servers: servers, _underlay: underlay })
    }

    /// Routes each node's way to the other's pod: the computed route through the device, or a
    /// more specific route via the peer's underlay address over it, as a host-gw CNI routes.
    fn take(&mut self, path: Path) -> BenchResult<()> {
        for i in 0..2 {
            let (me, peer) = (&self.nodes[i], &self.nodes[1 - i]);
            let host = format!("{}/32", peer.pod_address());
            match path {
                Path::Underlay => me.ns.ip(&["route", "replace", &host, "via", &peer.underlay(), "dev", "eth0"])?,
                Path::Mesh => me.ns.ip(&["route", "flush", "exact", &host])?,
            };
        }
        let (a, b) = (&self.nodes[0], &self.nodes[1]);
        let route = a.ns.ip(&["route", "get", &b.pod_address()])?;
        let dev = if path == Path::Mesh { DEVICE } else { "eth0" };
        if !route.contains(&format!("dev {dev}")) {
            return Err(format!("{}: the route is {route}", path.name()));
        }
        Ok(())
    }

    /// iperf3 from pod 1 to pod 2: Gbit/s.
    fn throughput(&self, secs: u32) -> BenchResult<f64> {
        let out = run(&mut self.nodes[0].pod.command(&[
            "iperf3",
            "-c",
            &self.nodes[1].pod_address(),
            "-p",
            &IPERF_PORT.to_string(),
            "-t",
            &secs.to_string(),
            "-O",
            "1",
            "-J",
        ]))?;
        let json: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("iperf3: {e}"))?;
        json["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .map(|b| b / 1e9)
            .ok_or_else(|| format!("iperf3 without a result: {out}"))
    }

    /// Sequential UDP round trips from pod 1 to pod 2's echo: (median, p99) in microseconds.
    fn round_trips(&self) -> BenchResult<(f64, f64)> {
        let out = run(&mut self.nodes[0].pod.command(&[
            "python3",
            "-c",
            RTT_CLIENT,
            &self.nodes[1].pod_address(),
            &ECHO_PORT.to_string(),
            &ROUND_TRIPS.to_string(),
        ]))?;
        let mut it = out.split_whitespace().map(str::parse::<f64>);
        match (it.next(), it.next()) {
            (Some(Ok(median)), Some(Ok(p99))) => Ok((median, p99)),
            _ => Err(format!("round trips: {out}")),
        }
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

fn spread(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    format!("{:.3} ({min:.3}-{max:.3})", median(v))
}

fn env_or(key: &str, default: u32) -> u32 {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> BenchResult<()> {
    if !is_root() {
        println!("overlay bench: needs root, skipped");
        return Ok(());
    }
    let (rounds, secs) = (env_or("KUPORT_BENCH_ROUNDS", 7), env_or("KUPORT_BENCH_SECS", 3));
    let mut bench = Bench::new()?;
    // The first handshake, before anything is timed.
    bench.take(Path::Mesh)?;
    bench.round_trips()?;
    let link = bench.nodes[0].ns.ip(&["-o", "link", "show", DEVICE])?;
    println!("{}", link.split_whitespace().take(5).collect::<Vec<_>>().join(" "));
    measure(&mut bench, rounds, secs, "not shaped")?;
    let shape = env_or("KUPORT_BENCH_SHAPE_MBIT", 100);
    if shape > 0 {
        // A home's uplink: both paths leave node 1 by eth0, the mesh's as WireGuard datagrams.
        let rate = format!("{shape}mbit");
        let tbf =
            ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", &rate, "burst", "64kb", "latency", "50ms"];
        run(&mut bench.nodes[0].ns.command(&tbf))?;
        measure(&mut bench, rounds, secs, &format!("node 1's eth0 shaped to {shape} Mbit/s (tbf)"))?;
    }
    bench.take(Path::Mesh)?;
    Ok(())
}

/// `rounds` of both paths, alternating which goes first; a table and the per-round ratios.
fn measure(bench: &mut Bench, rounds: u32, secs: u32, what: &str) -> BenchResult<()> {
    println!("\n== {what}");
    let mut gbit = [Vec::new(), Vec::new()];
    let mut rtt = [Vec::new(), Vec::new()];
    let mut p99 = [Vec::new(), Vec::new()];
    let mut ratios = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let order = if round % 2 == 0 { [Path::Mesh, Path::Underlay] } else { [Path::Underlay, Path::Mesh] };
        for path in order {
            bench.take(path)?;
            let i = path as usize;
            gbit[i].push(bench.throughput(secs)?);
            let (m, p) = bench.round_trips()?;
            rtt[i].push(m);
            p99[i].push(p);
        }
        let r = gbit[0].len() - 1;
        ratios.0.push(gbit[0][r] / gbit[1][r]);
        ratios.1.push(rtt[0][r] / rtt[1][r]);
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "round {round}: mesh {:.3} Gbit/s {:.0} us, underlay {:.3} Gbit/s {:.0} us; load {}",
            gbit[0][r],
            rtt[0][r],
            gbit[1][r],
            rtt[1][r],
            load.split_whitespace().next().unwrap_or("?")
        );
    }
    println!("\n| path | TCP Gbit/s: median (min-max) | UDP round trip us: median (min-max) | p99 us: median |");
    println!("|---|---|---|---|");
    for path in [Path::Mesh, Path::Underlay] {
        let i = path as usize;
        println!("| {} | {} | {} | {:.0} |", path.name(), spread(&gbit[i]), spread(&rtt[i]), median(&p99[i]));
    }
    println!("\nmesh/underlay per round: throughput {}, round trip {}", spread(&ratios.0), spread(&ratios.1));
    Ok(())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}
