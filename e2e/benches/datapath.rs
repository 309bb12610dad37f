//! Datapath benchmark (issue 8): new TCP connections and new UDP flows per second through the
//! accepting node, with 10 and with 50,000 mappings installed.
//!
//! Run as root: `cargo bench -p kuport-lab --bench datapath`. Environment: KUPORT_BENCH_ROUNDS
//! (default 30), KUPORT_BENCH_MS per measurement (500), KUPORT_BENCH_WORKERS parallel connectors
//! (4), KUPORT_BENCH_MAPPINGS (50000), KUPORT_BENCH_CALIBRATION rounds with both labs at 10 (10).
//! KUPORT_BENCH_COMPARE=steer compares instead lab A without the steering chain and lab B with it,
//! both at 10 mappings (docs/portmap/firewall.md): the steering chain's cost per new flow.
//! KUPORT_BENCH_COMPARE=guard compares lab A with KUPORT_BENCH_MAPPINGS mappings and no
//! allow-list and lab B with the same mappings, each with an allow-list of two prefixes, one
//! of them the client's (docs/portmap/guard.md): the allow-list's cost per new flow.
//! KUPORT_BENCH_COMPARE=limit does the same with a rate limit on every mapping of lab B instead
//! (1,000,000 new flows per second per client: it never binds, so what is measured is its
//! lookup, jump and bucket update per new flow); KUPORT_BENCH_COMPARE=protect with both.
//!
//! Two labs side by side, identical but for their tables: the machine is shared and noisy, so
//! the compared configurations are measured interleaved in short slices (each target on one
//! lab, then at once on the other, the order alternating by round) rather than one after the
//! other, and each round's B/A ratio is kept. Applying 50,000 mappings takes tens of seconds,
//! too slow to swap tables between rounds. Calibration rounds with both labs at 10 mappings
//! first show how far two identical labs differ.
//!
//! The mappings: four real PortMaps (TCP and UDP to web-0 on edge-a, TCP to api-0 and a UDP
//! range to game-0 on worker-2), computed by the controller's compute, plus synthetic mappings
//! added to the computed states as the controller would render them, all published on edge-a's
//! enp1s0: half to 100 pods on edge-a, half over the edge-a/worker-2 link to 100 pods on
//! worker-2 (every 10th a UDP range of 10 ports, the rest single TCP ports). So the nodes a flow
//! crosses hold the mappings' elements in the maps and sets its lookups use (edge-a:
//! publish_port, publish_range, claim_port, claim_range; worker-2: link_port, link_range and the
//! _port and _range sets of claim, reply_claim and return_mark), and both labs have the same
//! sets and rules.
//!

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "shared/mod.rs"]
mod shared;

use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{assert_intact, host_state, kuport_table, port_map, with_classes};
use kuport_controller::api::RateLimit;
use kuport_controller::compute::portmap::datapath::Family;
use kuport_controller::compute::portmap::steer;
use kuport_lab::echo::parse_answer;
use kuport_lab::program::{apply, compute};
use kuport_lab::sys::in_netns;
use kuport_lab::{Lab, Protocol, Topology};
use kuport_proto::build::{
    addr, chain as chain_of, counter, ct_state, drop, ifname, jump_to, limit, mark, ports, proto, rule, set_update,
};
use kuport_proto::v1::{L4Proto, NftElement, NftTable, NftType, NftValue, NodeState, Selector, nft_value::Value};
use rustix::net::{AddressFamily, SocketFlags, SocketType, sockopt};
use shared::{ACCEPTING, CLIENT, POD_NODE, PUBLIC, env_or, load_average, stats};

const PUBLIC_IF: &str = "enp1s0";
/// Synthetic mapping i publishes FIRST_SYNTHETIC_PORT + i (and, for a range, the 9 after it),
/// above the real mappings' ports; from SKIP_FROM on SKIP higher, clear of the game range
/// 27015-27115 (an interval set refuses overlapping elements).
const FIRST_SYNTHETIC_PORT: u32 = 10_000;
const SKIP_FROM: u32 = 27_000;
const SKIP: u32 = 120;
const RANGE_EVERY: usize = 10;
const RANGE_WIDTH: u32 = 10;
/// Synthetic pods per node: .150 to .249 of its pod CIDR, clear of the lab's pods.
const SYNTHETIC_PODS: usize = 100;
/// The real PortMaps: the rest of a lab's mappings are synthetic.
const REAL_MAPPINGS: usize = 4;
/// Source ports the connectors bind, one per flow, never reused within a measurement: a UDP
/// flow that reused a port would meet its old conntrack entry instead of the maps.
const FIRST_SOURCE_PORT: u32 = 1024;
const LAST_SOURCE_PORT: u32 = 65_535;

/// What one measurement dials.
struct Target {
    path: &'static str,
    protocol: Protocol,
    port: u16,
    pod: &'static str,
}

const TARGETS: [Target; 4] = [
    Target { path: "pod on the accepting node (web-0)", protocol: Protocol::Tcp, port: 3000, pod: "web-0" },
    Target { path: "pod over the link (api-0, worker-2)", protocol: Protocol::Tcp, port: 9000, pod: "api-0" },
    Target { path: "pod on the accepting node (web-0)", protocol: Protocol::Udp, port: 3000, pod: "web-0" },
    Target { path: "pod over the link (game-0, worker-2)", protocol: Protocol::Udp, port: 27015, pod: "game-0" },
];

struct Config {
    rounds: usize,
    calibration: usize,
    duration: Duration,
    workers: usize,
    mappings: usize,
}

impl Config {
    fn from_env() -> Config {
        Config {
            rounds: env_or("KUPORT_BENCH_ROUNDS", 30),
            calibration: env_or("KUPORT_BENCH_CALIBRATION", 10),
            duration: Duration::from_millis(env_or("KUPORT_BENCH_MS", 500) as u64),
            workers: env_or("KUPORT_BENCH_WORKERS", 4),
            mappings: env_or("KUPORT_BENCH_MAPPINGS", 50_000),
        }
    }
}

/// The default lab, with web-0 also serving UDP 3000 (a local UDP target).
fn topology() -> Topology {
    let mut t = Topology::default_lab();
    let web = t.pods.iter_mut().find(|p| p.name == "web-0").expect("the default lab has web-0");
    web.udp.push("3000".parse().expect("a port"));
    let svc = t.services.iter_mut().find(|s| s.name == "web").expect("the default lab has Service web");
    let mut udp = svc.ports[0].clone();
    udp.name = "udp".into();
    udp.protocol = Protocol::Udp;
    svc.ports.push(udp);
    t
}

/// The allow-list of every mapping in lab B of the guard comparison: the client's address and
/// a network it is not in.
const GUARD_PREFIXES: [&str; 2] = ["198.51.100.8/32", "192.0.2.0/24"];

/// The rate limit of every mapping in lab B of the limit comparison: far above what one client
/// sends, so it never drops.
const NEVER_BINDS: u32 = 1_000_000;

/// What lab B's mappings carry: an allow-list, a rate limit, or both.
#[derive(Clone, Copy, Default)]
struct Protect {
    guard: bool,
    limit: bool,
}

fn manifests_protected(protect: Protect) -> kuport_lab::Manifests {
    let mut m = manifests();
    for pm in &mut m.cluster.port_maps {
        if protect.guard {
            pm.spec.source_ranges = GUARD_PREFIXES.iter().map(|p| p.to_string()).collect();
        }
        if protect.limit {
            let limit = RateLimit { new_per_second: NEVER_BINDS, burst: None, max_connections: None };
            pm.spec.rate_limit = Some(limit);
        }
    }
    m
}

fn manifests() -> kuport_lab::Manifests {
    with_classes(
        &(port_map("web", "web-tcp", "public", "TCP", "3000", "web", "http")
            + &port_map("web", "web-udp", "public", "UDP", "3000", "web", "udp")
            + &port_map("apps", "api", "public", "TCP", "9000", "api", "api")
            + &port_map("games", "game", "public", "UDP", "27015-27115", "game", "game")),
    )
}

/// The value of `key` of the given type (the sets' keys hold each type at most once).
fn of_type(key: &[NftValue], ty: NftType) -> &NftValue {
    key.iter().find(|v| type_of(v) == ty as i32).unwrap_or_else(|| panic!("no {ty:?} in {key:?}"))
}

fn type_of(v: &NftValue) -> i32 {
    let ty = match v.value {
        Some(Value::Ifname(_)) => NftType::Ifname,
        Some(Value::Addr(_)) => NftType::Ipv4Addr,
        Some(Value::Proto(_)) => NftType::InetProto,
        Some(Value::Port(_)) => NftType::InetService,
        Some(Value::Mark(_)) => NftType::Mark,
        _ => NftType::Unspecified,
    };
    ty as i32
}

/// Adds an element to set `name`, its key ordered as the set declares it: the synthetic
/// mappings follow whatever field order the controller renders.
fn push(t: &mut NftTable, name: &str, key: Vec<NftValue>, data: Vec<NftValue>) {
    let set = t.sets.iter_mut().find(|s| s.name == name).unwrap_or_else(|| panic!("no set {name}"));
    let key = set.key.iter().map(|ty| key.iter().find(|v| type_of(v) == *ty).cloned().expect("a key field")).collect();
    set.elements.push(NftElement { key, data });
}

fn set_elements<'a>(t: &'a mut NftTable, name: &str) -> &'a mut Vec<NftElement> {
    let set = t.sets.iter_mut().find(|s| s.name == name);
    &mut set.unwrap_or_else(|| panic!("the computed table has no set {name}")).elements
}

/// The set of `base` that holds ports `first` to `last`: `base_port` for a single port (a hash
/// set), `base_range` for a range (an interval set), as the controller renders them.
fn sized(base: &str, first: u32, last: u32) -> String {
    format!("{base}_{}", if first == last { "port" } else { "range" })
}

/// The first element of a set, to read the link's names and numbers from.
fn first(t: &mut NftTable, set: &str) -> NftElement {
    set_elements(t, set).first().cloned().unwrap_or_else(|| panic!("set {set} is empty"))
}

fn text_of(value: &NftValue) -> String {
    match &value.value {
        Some(Value::Ifname(s) | Value::Addr(s)) => s.clone(),
        other => panic!("expected a name or an address, got {other:?}"),
    }
}

/// What the synthetic mappings share with the real game mapping: the edge-a/worker-2 link.
struct Link {
    /// edge-a's device and worker-2's end of the link (where edge-a sends the flows).
    edge_device: String,
    far: Ipv4Addr,
    /// worker-2's device and the mark its replies get.
    pod_node_device: String,
    mark: u32,
    /// The stand-ins (docs/portmap/firewall.md): worker-2's for `far`, which its link maps are
    /// keyed by, and edge-a's public address with its own.
    far_stand_in: Ipv4Addr,
    public: (Ipv4Addr, Ipv4Addr),
}

fn link_of(states: &mut BTreeMap<String, std::sync::Arc<NodeState>>) -> Link {
    let edge = kuport_table(host_state(states, ACCEPTING));
    let far: Ipv4Addr = text_of(&first(edge, "publish_range").data[0]).parse().expect("an address");
    let claim = set_elements(edge, "claim_range")
        .iter()
        .find(|e| text_of(of_type(&e.key, NftType::Ipv4Addr)) == far.to_string())
        .cloned();
    let edge_device = text_of(of_type(&claim.expect("edge-a claims the link's far end").key, NftType::Ifname));
    let pod_node = kuport_table(host_state(states, POD_NODE));
    let pod_node_device = text_of(of_type(&first(pod_node, "link_range").key, NftType::Ifname));
    let far_stand_in =
        text_of(of_type(&first(pod_node, "link_range").key, NftType::Ipv4Addr)).parse().expect("an address");
    let mark = match first(pod_node, "return_mark_range").data[0].value {
        Some(Value::Mark(m)) => m,
        ref other => panic!("return_mark_range maps to a mark, not {other:?}"),
    };
    let edge = kuport_table(host_state(states, ACCEPTING));
    let steered = set_elements(edge, "steer_range")
        .iter()
        .find(|e| text_of(of_type(&e.key, NftType::Ifname)) == PUBLIC_IF)
        .cloned()
        .expect("edge-a steers its public address");
    let public = (
        text_of(of_type(&steered.key, NftType::Ipv4Addr)).parse().expect("an address"),
        text_of(&steered.data[0]).parse().expect("an address"),
    );
    Link { edge_device, far, pod_node_device, mark, far_stand_in, public }
}

/// One synthetic mapping, published on edge-a's enp1s0.
struct Synthetic {
    /// Its pod is on worker-2 (over the link), else on edge-a.
    remote: bool,
    pod: Ipv4Addr,
    protocol: L4Proto,
    /// The published ports, also the pod's.
    first: u32,
    last: u32,
}

/// Synthetic mapping i: even ones to pods on worker-2, odd ones to pods on edge-a; every 10th a
/// UDP range (always remote), the others single TCP ports.
fn synthetic(i: usize) -> Synthetic {
    let remote = i.is_multiple_of(2);
    let node_pods = if remote { Ipv4Addr::new(10, 244, 2, 150) } else { Ipv4Addr::new(10, 244, 18, 150) };
    let pod = Ipv4Addr::from(u32::from(node_pods) + (i / 2 % SYNTHETIC_PODS) as u32);
    let first = FIRST_SYNTHETIC_PORT + i as u32;
    let first = if first >= SKIP_FROM { first + SKIP } else { first };
    if i.is_multiple_of(RANGE_EVERY) {
        Synthetic { remote, pod, protocol: L4Proto::Udp, first, last: first + RANGE_WIDTH - 1 }
    } else {
        Synthetic { remote, pod, protocol: L4Proto::Tcp, first, last: first }
    }
}

/// Adds `count` synthetic mappings to the computed states of edge-a and worker-2, as the
/// controller renders them (datapath.rs): edge-a publishes each, to the pod or to the link's far
/// end, and claims it; worker-2 translates the remote ones from the link and claims and marks
/// their replies.
fn add_synthetic(states: &mut BTreeMap<String, std::sync::Arc<NodeState>>, count: usize, protect: Protect) {
    let link = link_of(states);
    let edge = kuport_table(host_state(states, ACCEPTING));
    for m in (0..count).map(synthetic) {
        let (p, first, last) = (proto(m.protocol), m.first, m.last);
        // As steer.rs renders them: the mapping's chains, named by its tag (every mapping is on
        // enp1s0, the only protected interface).
        let tag = steer::tag(&[PUBLIC_IF].into(), PUBLIC_IF, m.protocol, first as u16);
        let limit_chain = steer::chain_name(steer::CHAIN_LIMIT, Family::V4, tag);
        if protect.limit {
            // Reached from the mapping's guard chain when it has one, else from the limit map.
            if !protect.guard {
                let (map, key) = if first == last {
                    (steer::MAP_LIMIT_PORT, vec![ifname(PUBLIC_IF), addr(link.public.0), p.clone(), ports(first, last)])
                } else {
                    (
                        steer::MAP_LIMIT_RANGE,
                        vec![ports(first, last), ifname(PUBLIC_IF), addr(link.public.0), p.clone()],
                    )
                };
                push(edge, map, key, vec![jump_to(&limit_chain)]);
            }
            let update = set_update(
                &[Selector::IpSaddr],
                Some(tag),
                steer::SET_RATE,
                limit(NEVER_BINDS.into(), NEVER_BINDS, true),
            );
            edge.chains.push(chain_of(
                &limit_chain,
                vec![rule(vec![ct_state(ct_state::NEW)], vec![update, counter(), drop()])],
            ));
        }
        if protect.guard {
            // The jump, for every packet, to the mapping's chain, which drops what is outside the
            // list and sends what it admits on to the limit chain.
            let chain = steer::chain_name(steer::CHAIN_GUARD, Family::V4, tag);
            let (map, key) = if first == last {
                (steer::MAP_GUARD_PORT, vec![ifname(PUBLIC_IF), addr(link.public.0), p.clone(), ports(first, last)])
            } else {
                (steer::MAP_GUARD_RANGE, vec![ports(first, last), ifname(PUBLIC_IF), addr(link.public.0), p.clone()])
            };
            push(edge, map, key, vec![jump_to(&chain)]);
            let nets: Vec<ipnet::IpNet> = GUARD_PREFIXES.iter().map(|n| n.parse().expect("a prefix")).collect();
            let then = protect.limit.then_some(limit_chain.as_str());
            let rules = steer::allow_list_rules(Family::V4, &nets, then).expect("the list is no /0");
            edge.chains.push(chain_of(&chain, rules));
        }
        let to = if m.remote { link.far } else { m.pod };
        // The publish maps are keyed by the public address's stand-in (docs/portmap/firewall.md).
        let stand_in = addr(link.public.1);
        if first == last {
            let data = vec![addr(to), ports(first, first)];
            let key = vec![ifname(PUBLIC_IF), stand_in, p.clone(), ports(first, first)];
            push(edge, "publish_port", key, data);
        } else {
            let key = vec![ifname(PUBLIC_IF), stand_in, p.clone(), ports(first, last)];
            push(edge, "publish_range", key, vec![addr(to)]);
        }
        let (oif, dst) = if m.remote { (link.edge_device.as_str(), link.far) } else { ("cilium_host", m.pod) };
        push(edge, &sized("claim", first, last), vec![ifname(oif), addr(dst), p.clone(), ports(first, last)], vec![]);
        let steer = vec![ifname(PUBLIC_IF), addr(link.public.0), p, ports(first, last)];
        push(edge, &sized("steer", first, last), steer, vec![addr(link.public.1)]);
    }
    let pod_node = kuport_table(host_state(states, POD_NODE));
    for m in (0..count).map(synthetic).filter(|m| m.remote) {
        let (p, first, last, pod) = (proto(m.protocol), m.first, m.last, addr(m.pod));
        let steer = vec![ifname(&link.pod_node_device), addr(link.far), p.clone(), ports(first, last)];
        push(pod_node, &sized("steer", first, last), steer, vec![addr(link.far_stand_in)]);
        let key = vec![ifname(&link.pod_node_device), addr(link.far_stand_in), p.clone(), ports(first, last)];
        if first == last {
            push(pod_node, "link_port", key, vec![pod.clone(), ports(first, first)]);
        } else {
            push(pod_node, "link_range", key, vec![pod.clone()]);
        }
        let claim = vec![ifname("cilium_host"), pod.clone(), p.clone(), ports(first, last)];
        push(pod_node, &sized("claim", first, last), claim, vec![]);
        let reply = vec![pod, p, ports(first, last)];
        push(pod_node, &sized("reply_claim", first, last), reply.clone(), vec![]);
        // Keyed by the ct mark the link's request saved, too (datapath.rs).
        let mut marked = reply;
        marked.push(mark(link.mark));
        push(pod_node, &sized("return_mark", first, last), marked, vec![mark(link.mark)]);
    }
    for node in [ACCEPTING, POD_NODE] {
        kuport_proto::canonical::canonicalize(std::sync::Arc::make_mut(
            states.get_mut(node).expect("a computed state"),
        ));
    }
}

/// Programs `lab` with the real PortMaps and enough synthetic ones to make `total`; without
/// edge-a's steering chain unless `steer`; every mapping protected as `protect` says.
fn program(lab: &mut Lab, total: usize, steer: bool, protect: Protect) {
    let m = manifests_protected(protect);
    let mut states = compute(lab, &m).node_states;
    add_synthetic(&mut states, total.saturating_sub(REAL_MAPPINGS), protect);
    if !steer {
        let t = kuport_table(host_state(&mut states, ACCEPTING));
        t.chains.retain(|c| c.name != kuport_controller::compute::portmap::steer::CHAIN_STEER);
    }
    let started = Instant::now();
    apply(lab, &states).expect("the lab applies its states");
    let counts: Vec<String> = [ACCEPTING, POD_NODE]
        .iter()
        .map(|n| {
            let listing = lab.exec(n, &["nft", "list", "table", "inet", "kuport"]).expect("nft lists kuport's table");
            format!("{n} {} lines", listing.lines().count())
        })
        .collect();
    println!(
        "lab {}: {total} mappings applied in {:.1} s; `nft list table inet kuport`: {}",
        lab.id(),
        started.elapsed().as_secs_f64(),
        counts.join(", ")
    );
    for t in &TARGETS {
        let to = SocketAddrV4::new(PUBLIC, t.port);
        let a = lab.probe(CLIENT, to, t.protocol).unwrap_or_else(|e| panic!("{CLIENT} -> {to}/{}: {e}", t.protocol));
        assert_intact(lab, CLIENT, &a, t.pod);
    }
}

/// Flows of one connector thread.
#[derive(Default)]
struct Counts {
    ok: u64,
    wrong: u64,
    failed: u64,
}

/// A socket bound to the given source port. TCP sockets close with a reset (SO_LINGER 0): no
/// TIME_WAIT in the client, and the pod's side is gone at once too.
fn bound_socket(kind: SocketType, port: u16) -> std::io::Result<OwnedFd> {
    let fd = rustix::net::socket_with(AddressFamily::INET, kind, SocketFlags::CLOEXEC, None)?;
    if kind == SocketType::STREAM {
        sockopt::set_socket_linger(&fd, Some(Duration::ZERO))?;
        // connect(2) gives up after SO_SNDTIMEO instead of retrying a lost SYN for minutes.
        sockopt::set_socket_timeout(&fd, sockopt::Timeout::Send, Some(Duration::from_secs(1)))?;
    }
    rustix::net::bind(&fd, &SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))?;
    Ok(fd)
}

/// One new flow: connect (or send one datagram), read the pod's answer, close. The answer:
/// (pod, the source it saw).
fn one_flow(protocol: Protocol, to: SocketAddrV4, port: u16) -> std::io::Result<String> {
    let mut text = String::new();
    match protocol {
        Protocol::Tcp => {
            let fd = bound_socket(SocketType::STREAM, port)?;
            rustix::net::connect(&fd, &to)?;
            let mut s = TcpStream::from(fd);
            s.set_read_timeout(Some(Duration::from_secs(1)))?;
            s.read_to_string(&mut text)?;
        }
        Protocol::Udp => {
            let s = UdpSocket::from(bound_socket(SocketType::DGRAM, port)?);
            s.connect(to)?;
            s.set_read_timeout(Some(Duration::from_millis(250)))?;
            s.send(b"x")?;
            let mut buf = [0u8; 256];
            let n = s.recv(&mut buf)?;
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    Ok(text)
}

/// One connector: new flows back to back until the deadline.
fn connector(t: &Target, client: Ipv4Addr, next_port: &AtomicU32, deadline: Instant) -> Counts {
    let to = SocketAddrV4::new(PUBLIC, t.port);
    let mut c = Counts::default();
    while Instant::now() < deadline {
        let p = next_port.fetch_add(1, Ordering::Relaxed);
        if p > LAST_SOURCE_PORT {
            break;
        }
        let port = p as u16;
        match one_flow(t.protocol, to, port) {
            Ok(text) => match parse_answer(&text) {
                Some((pod, seen)) if pod == t.pod && seen == SocketAddrV4::new(client, port) => c.ok += 1,
                _ => c.wrong += 1,
            },
            Err(_) => c.failed += 1,
        }
    }
    c
}

/// One measurement: the rate of answered new flows to `t` on `lab`, with a fresh conntrack
/// table on the nodes (so earlier rounds' entries neither help nor weigh). It ends after the
/// configured duration or once every source port was used, whichever comes first.
struct Rate {
    per_sec: f64,
    wrong: u64,
    failed: u64,
}

fn measure(lab: &Lab, t: &Target, cfg: &Config) -> Rate {
    for node in [ACCEPTING, POD_NODE] {
        lab.exec(node, &["conntrack", "-F"]).expect("conntrack -F (apt-get install conntrack)");
    }
    let ns = lab.netns(CLIENT).expect("the client's namespace");
    let client = lab.topology().client(CLIENT).expect("the client").address;
    let next_port = AtomicU32::new(FIRST_SOURCE_PORT);
    let start = Instant::now();
    let deadline = start + cfg.duration;
    let all: Vec<Counts> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..cfg.workers)
            .map(|_| s.spawn(|| in_netns(&ns, || Ok(connector(t, client, &next_port, deadline)))))
            .collect();
        workers.into_iter().map(|w| w.join().expect("a connector panicked").expect("entering the client")).collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let ok: u64 = all.iter().map(|c| c.ok).sum();
    Rate {
        per_sec: ok as f64 / elapsed,
        wrong: all.iter().map(|c| c.wrong).sum(),
        failed: all.iter().map(|c| c.failed).sum(),
    }
}

/// Rates per target for lab A and lab B, and each round's B/A ratio.
#[derive(Default)]
struct Series {
    a: Vec<Vec<f64>>,
    b: Vec<Vec<f64>>,
    ratio: Vec<Vec<f64>>,
}

/// `rounds` rounds: each target on A then B, or B then A on odd rounds.
fn run_rounds(labs: [&Lab; 2], rounds: usize, cfg: &Config, loads: &mut Vec<f64>, tag: &str) -> Series {
    let mut s =
        Series { a: vec![vec![]; TARGETS.len()], b: vec![vec![]; TARGETS.len()], ratio: vec![vec![]; TARGETS.len()] };
    for round in 0..rounds {
        for (i, t) in TARGETS.iter().enumerate() {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            let mut rates = [0.0; 2];
            for which in order {
                let r = measure(labs[which], t, cfg);
                if r.wrong > 0 || r.failed > 0 {
                    let lab = ["A", "B"][which];
                    println!(
                        "  note: {tag} round {} lab {lab} {}/{}: {} wrong, {} failed",
                        round + 1,
                        t.protocol,
                        t.port,
                        r.wrong,
                        r.failed
                    );
                }
                rates[which] = r.per_sec;
            }
            s.a[i].push(rates[0]);
            s.b[i].push(rates[1]);
            s.ratio[i].push(rates[1] / rates[0]);
        }
        let load = load_average();
        loads.push(load);
        let line: Vec<String> = (0..TARGETS.len())
            .map(|i| format!("{}/{} {:.0} {:.0}", TARGETS[i].protocol, TARGETS[i].port, s.a[i][round], s.b[i][round]))
            .collect();
        println!("  {tag} round {}: A B per s: {}; load {load:.2}", round + 1, line.join(", "));
    }
    s
}

fn print_table(s: &Series, a: &str, b: &str) {
    println!(
        "| protocol | path | {a}: median (min-max) /s | {b}: median (min-max) /s | ratio of medians | median of round ratios (min-max) |"
    );
    println!("|---|---|---|---|---|---|");
    for (i, t) in TARGETS.iter().enumerate() {
        let (am, alo, ahi) = stats(&s.a[i]);
        let (bm, blo, bhi) = stats(&s.b[i]);
        let (rm, rlo, rhi) = stats(&s.ratio[i]);
        println!(
            "| {} | {} | {am:.0} ({alo:.0}-{ahi:.0}) | {bm:.0} ({blo:.0}-{bhi:.0}) | {:.3} | {rm:.3} ({rlo:.3}-{rhi:.3}) |",
            t.protocol,
            t.path,
            bm / am
        );
    }
}

fn main() {
    if !kuport_lab::sys::is_root() {
        eprintln!("the datapath benchmark needs root (network namespaces); skipped");
        return;
    }
    let cfg = Config::from_env();
    let uname = kuport_lab::sys::run("uname", &["-r"], None).unwrap_or_default();
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "datapath benchmark: {} rounds (+{} calibration) of {} ms per target and lab, {} connectors; nproc {nproc}, kernel {}, load {:.2}",
        cfg.rounds,
        cfg.calibration,
        cfg.duration.as_millis(),
        cfg.workers,
        uname.trim(),
        load_average()
    );
    let t = topology();
    let mut a = Lab::up(&t).expect("lab A builds");
    let mut b = Lab::up(&t).expect("lab B builds");
    let compare = std::env::var("KUPORT_BENCH_COMPARE").unwrap_or_default();
    let steer = compare == "steer";
    let protect = Protect {
        guard: compare == "guard" || compare == "protect",
        limit: compare == "limit" || compare == "protect",
    };
    let what = match (protect.guard, protect.limit) {
        (true, true) => "allow-lists and rate limits",
        (true, false) => "allow-lists",
        (false, true) => "rate limits",
        (false, false) => "",
    };
    let none = Protect::default();
    program(&mut a, 10, true, none);
    program(&mut b, 10, true, none);
    let mut loads = vec![load_average()];
    if cfg.calibration > 0 {
        println!("calibration: both labs at 10 mappings");
        let s = run_rounds([&a, &b], cfg.calibration, &cfg, &mut loads, "calibration");
        println!("\nCalibration, A and B both with 10 mappings (B/A):\n");
        print_table(&s, "A, 10", "B, 10");
        println!();
    }
    let big = if steer {
        program(&mut a, 10, false, none);
        "B, 10 with steering".to_string()
    } else if !what.is_empty() {
        program(&mut a, cfg.mappings, true, none);
        program(&mut b, cfg.mappings, true, protect);
        format!("B, {} with {what}", cfg.mappings)
    } else {
        program(&mut b, cfg.mappings, true, none);
        format!("B, {}", cfg.mappings)
    };
    let a_name = if steer {
        "A, 10 without steering".to_string()
    } else if !what.is_empty() {
        format!("A, {} without {what}", cfg.mappings)
    } else {
        "A, 10".to_string()
    };
    let a_name = a_name.as_str();
    let s = run_rounds([&a, &b], cfg.rounds, &cfg, &mut loads, "measured");
    let (lm, llo, lhi) = stats(&loads);
    println!(
        "\nNew flows per second from {CLIENT} to {PUBLIC}, accepted on {ACCEPTING}; {} rounds of {} ms per target and lab, interleaved; load average {lm:.2} (median; {llo:.2}-{lhi:.2}):\n",
        cfg.rounds,
        cfg.duration.as_millis()
    );
    print_table(&s, a_name, &big);
    println!();
    // The verdict reads the median of the rounds' paired ratios: each pair was measured within a
    // second, so it is the figure the machine's drift disturbs least.
    for (i, t) in TARGETS.iter().enumerate() {
        let ratio = stats(&s.ratio[i]).0;
        let verdict = if ratio >= 0.95 { "within 5%" } else { "NOT within 5%" };
        println!(
            "{} {}: {big} / {a_name} = {ratio:.3} (median of round ratios; ratio of medians {:.3}), {verdict}",
            t.protocol,
            t.path,
            stats(&s.b[i]).0 / stats(&s.a[i]).0
        );
    }
}
