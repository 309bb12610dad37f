//! Throughput and MTU benchmark (issue 8): iperf3 from a client through the accepting node to a
//! pod on that node and, over the VXLAN link, to a pod on a worker; then datagrams of exactly
//! the link's MTU and one byte more, with and without DF.
//!
//! Run as root: `cargo bench -p kuport-lab --bench throughput` (needs iperf3, tcpdump:
//! `apt-get install iperf3 tcpdump`). Environment: KUPORT_BENCH_ROUNDS (default 9),
//! KUPORT_BENCH_SECS per iperf3 run (3, after 1 s omitted for slow start) and
//! KUPORT_BENCH_SHAPE_MBIT (1000; 0 skips the shaped runs).
//!
//! The two paths are measured interleaved, alternating which goes first, because the machine is
//! shared and noisy. Both are published on the same address, so the client's route cache is
//! flushed before every run: a path MTU learned over the link would otherwise shrink the local
//! path's segments too.
//!
//! Every node of the lab runs on the machine's cores: unshaped, both paths are CPU-bound, and
//! the remote one does more work per byte on the same cores (encapsulation, a second node's
//! netfilter and forwarding, decapsulation). The shaped runs put the bottleneck on the client's
//! link instead, as a real network would, and show what the link itself costs (headers, the
//! smaller MSS).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "shared/mod.rs"]
mod shared;

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{port_map, with_classes};
use kuport_lab::sys::in_netns;
use kuport_lab::{Lab, Protocol, Topology, program};
use rustix::net::sockopt::{self, Ipv4PathMtuDiscovery};
use shared::{ACCEPTING, CLIENT, POD_NODE, PUBLIC, env_or, load_average, stats};

const IPERF_PORT: u16 = 5201;
/// The remote pod's iperf3 is published on the next port (one public port per mapping).
const REMOTE_PUBLIC_PORT: u16 = 5202;
/// The MTU probes go to a UDP receiver of the bench's own in api-0, on this port.
const MTU_PORT: u16 = 9001;
/// IPv4 and UDP headers.
const HEADERS: usize = 28;

struct Path {
    name: &'static str,
    pod: &'static str,
    port: u16,
}

const PATHS: [Path; 2] = [
    Path { name: "pod on the accepting node (web-0 on edge-a)", pod: "web-0", port: IPERF_PORT },
    Path { name: "pod over the VXLAN link (api-0 on worker-2)", pod: "api-0", port: REMOTE_PUBLIC_PORT },
];

/// The default lab with Service ports for iperf3 (web-0 and api-0 listen on 5201) and for the
/// MTU probes (UDP 9001 on api-0).
fn topology() -> Topology {
    let mut t = Topology::default_lab();
    for (svc, name, protocol, port) in [
        ("web", "iperf", Protocol::Tcp, IPERF_PORT),
        ("api", "iperf", Protocol::Tcp, IPERF_PORT),
        ("api", "mtu", Protocol::Udp, MTU_PORT),
    ] {
        let s = t.services.iter_mut().find(|s| s.name == svc).expect("the default lab's Services");
        let mut p = s.ports[0].clone();
        (p.name, p.protocol, p.port, p.target_port) = (name.into(), protocol, port, None);
        s.ports.push(p);
    }
    t
}

fn manifests() -> kuport_lab::Manifests {
    with_classes(
        &(port_map("web", "web-iperf", "public", "TCP", &IPERF_PORT.to_string(), "web", "iperf")
            + &port_map("apps", "api-iperf", "public", "TCP", &REMOTE_PUBLIC_PORT.to_string(), "api", "iperf")
            + &port_map("apps", "api-mtu", "public", "UDP", &MTU_PORT.to_string(), "api", "mtu")),
    )
}

/// A process the bench started, killed when dropped (also on a panic).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn netns_cmd(lab: &Lab, host: &str, args: &[&str]) -> Command {
    lab.netns(host).expect("a host of the lab");
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &lab.netns_name(host)]).args(args);
    c
}

/// `iperf3 -s` in a pod, once it listens.
fn iperf_server(lab: &Lab, pod: &str) -> Proc {
    let port = IPERF_PORT.to_string();
    let child = netns_cmd(lab, pod, &["iperf3", "-s", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 starts (apt-get install iperf3)");
    let server = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while lab.exec(pod, &["ss", "-Hltn", &format!("sport = :{port}")]).expect("ss").trim().is_empty() {
        assert!(Instant::now() < deadline, "iperf3 in {pod} does not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

/// Forgets the path MTUs the client learned.
fn flush_client_routes(lab: &Lab) {
    lab.ip(CLIENT, &["route", "flush", "cache"]).expect("ip route flush cache");
}

struct Run {
    gbits: f64,
    retransmits: u64,
    /// The client's path MTU to the published address right after the run.
    path_mtu: u32,
}

fn iperf(lab: &Lab, port: u16, secs: usize) -> Run {
    flush_client_routes(lab);
    let out = netns_cmd(
        lab,
        CLIENT,
        &["iperf3", "-c", &PUBLIC.to_string(), "-p", &port.to_string(), "-t", &secs.to_string(), "-O", "1", "-J"],
    )
    .output()
    .expect("iperf3 runs");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 -J prints JSON");
    let end = &json["end"];
    let bits = end["sum_received"]["bits_per_second"].as_f64();
    let bits = bits.unwrap_or_else(|| panic!("iperf3 to port {port} failed: {}", json["error"]));
    Run {
        gbits: bits / 1e9,
        retransmits: end["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
        path_mtu: client_path_mtu(lab),
    }
}

/// The client's path MTU to the published address: a learned one (`ip route get` shows
/// `mtu N`), else its device's.
fn client_path_mtu(lab: &Lab) -> u32 {
    let route = lab.ip(CLIENT, &["route", "get", &PUBLIC.to_string()]).expect("ip route get");
    let words: Vec<&str> = route.split_whitespace().collect();
    let learned = words.windows(2).find(|w| w[0] == "mtu").and_then(|w| w[1].parse().ok());
    learned.unwrap_or_else(|| {
        let dev = words.windows(2).find(|w| w[0] == "dev").map_or("eth0", |w| w[1]);
        let json = lab.ip(CLIENT, &["-j", "link", "show", "dev", dev]).expect("ip link show");
        let link: serde_json::Value = serde_json::from_str(&json).expect("ip -j prints JSON");
        link[0]["mtu"].as_u64().unwrap_or_default() as u32
    })
}

/// Shapes the client's egress (the iperf3 data direction) to `mbit`, or removes the shaping.
fn shape_client(lab: &Lab, mbit: Option<usize>) {
    let _ = lab.exec(CLIENT, &["tc", "qdisc", "del", "dev", "eth0", "root"]);
    if let Some(mbit) = mbit {
        let rate = format!("{mbit}mbit");
        let args =
            ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", &rate, "burst", "1mb", "latency", "50ms"];
        lab.exec(CLIENT, &args).expect("tc tbf on the client");
    }
}

/// `rounds` iperf3 runs per path, interleaved, the order alternating by round; prints the table.
fn throughput(lab: &Lab, rounds: usize, secs: usize, shape: Option<usize>) {
    shape_client(lab, shape);
    let mut gbits = [vec![], vec![]];
    let mut retransmits = [vec![], vec![]];
    let mut mtus = [vec![], vec![]];
    let mut ratios = vec![];
    let mut loads = vec![load_average()];
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut this = [0.0; 2];
        for i in order {
            let r = iperf(lab, PATHS[i].port, secs);
            this[i] = r.gbits;
            gbits[i].push(r.gbits);
            retransmits[i].push(r.retransmits as f64);
            mtus[i].push(r.path_mtu);
        }
        ratios.push(this[1] / this[0]);
        loads.push(load_average());
        println!(
            "  round {}: local {:.2} Gbit/s, remote {:.2} Gbit/s, remote/local {:.3}; load {:.2}",
            round + 1,
            this[0],
            this[1],
            this[1] / this[0],
            loads[loads.len() - 1]
        );
    }
    shape_client(lab, None);
    let (lm, llo, lhi) = stats(&loads);
    let shaped = shape.map_or("not shaped".to_string(), |m| format!("shaped to {m} Mbit/s (tbf)"));
    println!(
        "\niperf3 (one TCP stream, {secs} s after 1 s omitted) from {CLIENT} to {PUBLIC}, accepted on {ACCEPTING}, the client's egress {shaped}; {rounds} rounds, interleaved; load average {lm:.2} (median; {llo:.2}-{lhi:.2}):\n"
    );
    println!(
        "| path | Gbit/s: median (min-max) | retransmits per run: median (min-max) | client path MTU after a run |"
    );
    println!("|---|---|---|---|");
    for (i, p) in PATHS.iter().enumerate() {
        let (m, lo, hi) = stats(&gbits[i]);
        let (rm, rlo, rhi) = stats(&retransmits[i]);
        let mut seen = mtus[i].clone();
        seen.sort_unstable();
        seen.dedup();
        let seen: Vec<String> = seen.iter().map(u32::to_string).collect();
        println!("| {} | {m:.2} ({lo:.2}-{hi:.2}) | {rm:.0} ({rlo:.0}-{rhi:.0}) | {} |", p.name, seen.join(", "));
    }
    let ratio = stats(&gbits[1]).0 / stats(&gbits[0]).0;
    let (rm, rlo, rhi) = stats(&ratios);
    let verdict = if rm >= 0.9 { "met" } else { "NOT met" };
    println!(
        "\nremote/local: median of round ratios {rm:.3} ({rlo:.3}-{rhi:.3}), ratio of medians {ratio:.3}; goal >= 0.90 {verdict}"
    );
}

/// The MTU of kuport's link on edge-a, as applied.
fn link_mtu(lab: &Lab) -> (String, usize) {
    let json = lab.ip(ACCEPTING, &["-d", "-j", "link", "show"]).expect("ip -d -j link show");
    let links: serde_json::Value = serde_json::from_str(&json).expect("ip -j prints JSON");
    let link =
        links.as_array().into_iter().flatten().find(|l| l["ifname"].as_str().is_some_and(|n| n.starts_with("kup-")));
    let link = link.expect("edge-a has a kup- link");
    let name = link["ifname"].as_str().unwrap_or_default().to_string();
    (name, link["mtu"].as_u64().expect("a link MTU") as usize)
}

/// Counters of /proc/net/snmp in a host's namespace, as "Ip.FragOKs" and so on.
fn snmp(lab: &Lab, host: &str) -> BTreeMap<String, i64> {
    let text = lab.exec(host, &["cat", "/proc/net/snmp"]).expect("/proc/net/snmp");
    let lines: Vec<&str> = text.lines().collect();
    let mut out = BTreeMap::new();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        let (group, names) = names.split_once(':').unwrap_or_default();
        let values = values.split_once(':').map(|(_, v)| v).unwrap_or_default();
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            out.insert(format!("{group}.{n}"), v.parse().unwrap_or_default());
        }
    }
    out
}

/// The counters that moved between two readings, as "name +delta".
fn moved(before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>, names: &[&str]) -> String {
    let parts: Vec<String> = names
        .iter()
        .filter_map(|n| {
            let d = after.get(*n).copied().unwrap_or_default() - before.get(*n).copied().unwrap_or_default();
            (d != 0).then(|| format!("{n} +{d}"))
        })
        .collect();
    if parts.is_empty() { "none".into() } else { parts.join(", ") }
}

/// A UDP receiver in a pod: answers every datagram with its length.
struct Receiver {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    fn start(lab: &Lab, pod: &str, port: u16) -> Receiver {
        let path = lab.netns(pod).expect("the pod's namespace");
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let served = in_netns(&path, || {
                let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))?;
                s.set_read_timeout(Some(Duration::from_millis(50)))?;
                let _ = ready_tx.send(());
                let mut buf = vec![0u8; 65_536];
                while !halt.load(Ordering::Relaxed) {
                    if let Ok((n, peer)) = s.recv_from(&mut buf) {
                        let _ = s.send_to(n.to_string().as_bytes(), peer);
                    }
                }
                Ok(())
            });
            served.expect("the MTU receiver runs");
        });
        ready_rx.recv_timeout(Duration::from_secs(5)).expect("the MTU receiver binds");
        Receiver { stop, thread: Some(thread) }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What one oversize or exact datagram met.
struct Sent {
    /// The payload length the pod reported receiving.
    received: Option<usize>,
    /// The client's path MTU to the published address after it (getsockopt IP_MTU).
    path_mtu: i32,
    send_error: Option<String>,
}

/// From the client: a fresh UDP socket, optionally one small datagram first (so the flow's
/// conntrack entry exists on the nodes), then `payload` bytes with or without DF.
fn send_datagram(lab: &Lab, payload: usize, df: bool, warm: bool) -> Sent {
    let path = lab.netns(CLIENT).expect("the client's namespace");
    let to = SocketAddrV4::new(PUBLIC, MTU_PORT);
    in_netns(&path, || {
        let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))?;
        let mode = if df { Ipv4PathMtuDiscovery::DO } else { Ipv4PathMtuDiscovery::DONT };
        sockopt::set_ip_mtu_discover(&s, mode)?;
        s.connect(to)?;
        s.set_read_timeout(Some(Duration::from_millis(500)))?;
        let mut buf = [0u8; 64];
        if warm {
            s.send(b"x")?;
            s.recv(&mut buf)?;
        }
        let send_error = s.send(&vec![b'm'; payload]).err().map(|e| e.to_string());
        let received = match s.recv(&mut buf) {
            Ok(n) => String::from_utf8_lossy(&buf[..n]).parse().ok(),
            Err(_) => None,
        };
        // 0 when the kernel knows no path MTU for the socket.
        let mtu = sockopt::ip_mtu(&s).ok().and_then(|m| i32::try_from(m).ok()).unwrap_or(0);
        Ok(Sent { received, path_mtu: mtu, send_error })
    })
    .expect("sending from the client")
}

/// tcpdump in the client, printing the first ICMP packet it sees.
fn capture_icmp(lab: &Lab) -> Proc {
    let mut child = netns_cmd(lab, CLIENT, &["tcpdump", "-l", "-n", "-v", "-i", "eth0", "-c", "1", "icmp"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump starts (apt-get install tcpdump)");
    let stderr = child.stderr.take().expect("tcpdump's stderr");
    let mut line = String::new();
    BufReader::new(stderr).read_line(&mut line).expect("tcpdump says it listens");
    assert!(line.contains("listening"), "tcpdump: {line}");
    Proc(child)
}

/// tcpdump's -v line without its timestamp and IP header details ("(tos ..., length N)"), which
/// the table has no room for.
fn condense(line: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if depth == 0 && rest.starts_with("(tos ") {
            depth = 1;
        } else if depth > 0 {
            depth += match c {
                '(' => 1,
                ')' => -1,
                _ => 0,
            };
        } else {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    let words: Vec<&str> = out.split_whitespace().collect();
    let words = if words.first().is_some_and(|w| w.contains(':') && w.contains('.')) { &words[1..] } else { &words };
    words.join(" ")
}

/// What tcpdump printed, after at most `wait` for its one packet.
fn captured(mut p: Proc, wait: Duration) -> String {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline && p.0.try_wait().ok().flatten().is_none() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = p.0.kill();
    let mut text = String::new();
    if let Some(out) = p.0.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            text.push_str(line.trim());
            text.push(' ');
        }
    }
    if text.is_empty() { "nothing".into() } else { condense(&text) }
}

fn mtu(lab: &Lab) {
    let (link, mtu) = link_mtu(lab);
    let _receiver = Receiver::start(lab, "api-0", MTU_PORT);
    println!(
        "\nMTU: edge-a's link {link} has MTU {mtu}; UDP from {CLIENT} to {PUBLIC}:{MTU_PORT} (api-0 on {POD_NODE}):\n"
    );
    println!(
        "| IP packet | DF | first datagram of the flow | pod received (payload) | client path MTU after | ICMP at the client | edge-a counters | {POD_NODE} counters |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let edge_counters = ["Ip.FragOKs", "Ip.FragCreates", "Ip.FragFails", "Icmp.OutDestUnreachs"];
    let pod_node_counters = ["Ip.ReasmReqds", "Ip.ReasmOKs", "Ip.ReasmFails"];
    for (size, df, warm) in
        [(mtu, false, true), (mtu + 1, false, true), (mtu, true, true), (mtu + 1, true, true), (mtu + 1, true, false)]
    {
        flush_client_routes(lab);
        let (edge0, pod0) = (snmp(lab, ACCEPTING), snmp(lab, POD_NODE));
        let tcpdump = capture_icmp(lab);
        let sent = send_datagram(lab, size - HEADERS, df, warm);
        let icmp = captured(tcpdump, Duration::from_millis(500));
        let (edge1, pod1) = (snmp(lab, ACCEPTING), snmp(lab, POD_NODE));
        let received = match (&sent.received, &sent.send_error) {
            (Some(n), _) => format!("{n} bytes"),
            (None, Some(e)) => format!("nothing (send: {e})"),
            (None, None) => "nothing".into(),
        };
        println!(
            "| {size} | {} | {} | {received} | {} | {icmp} | {} | {} |",
            if df { "yes" } else { "no" },
            if warm { "no (a 1-byte one first)" } else { "yes" },
            sent.path_mtu,
            moved(&edge0, &edge1, &edge_counters),
            moved(&pod0, &pod1, &pod_node_counters),
        );
    }
}

fn main() {
    if !kuport_lab::sys::is_root() {
        eprintln!("the throughput benchmark needs root (network namespaces); skipped");
        return;
    }
    let rounds = env_or("KUPORT_BENCH_ROUNDS", 9);
    let secs = env_or("KUPORT_BENCH_SECS", 3);
    let shape = env_or("KUPORT_BENCH_SHAPE_MBIT", 1000);
    let uname = kuport_lab::sys::run("uname", &["-r"], None).unwrap_or_default();
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("throughput benchmark: nproc {nproc}, kernel {}, load {:.2}", uname.trim(), load_average());
    let mut lab = Lab::up(&topology()).expect("the lab builds");
    program(&mut lab, &manifests()).expect("the lab is programmed");
    let _servers: Vec<Proc> = PATHS.iter().map(|p| iperf_server(&lab, p.pod)).collect();
    throughput(&lab, rounds, secs, None);
    if shape > 0 {
        throughput(&lab, rounds, secs, Some(shape));
    }
    mtu(&lab);
}
