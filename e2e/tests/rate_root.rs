//! Per-source rate limits with real packets (docs/portmap/guard.md, "Rate limits"): the default
//! lab's game range (edge-a, over the link to game-0 on worker-2) bounds new UDP flows per
//! client. client-2 floods it with new flows; what reaches game-0 stays within the bucket
//! (burst plus rate times the flood's time), every drop is counted in the mapping's chain, and
//! client-1 is served throughout. The API's TCP port bounds new connections (SYNs, in a burst
//! and held for 2 s, counted where they arrive in api-0) and the connections a client holds.
//! Each ends with the ablation: without the dispatch rule, the flood reaches the pod.
//! Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1. Each lab is removed on drop.

mod common;
use common::dual::assert_maps_any;
use common::*;

use std::collections::{BTreeMap, VecDeque};
use std::io::Read as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use kuport_controller::api::{PortMapSpec, RateLimit};
use kuport_controller::compute::Outputs;
use kuport_controller::compute::portmap::steer::TRACKED_CLIENTS;
use kuport_lab::Protocol::{Tcp, Udp};
use kuport_lab::echo::parse_answer;
use kuport_lab::program::{apply, compute};
use kuport_lab::sys::in_netns;
use kuport_lab::{Flow, Prober, Protocol, Target};
use kuport_lab::{Lab, Manifests};
use kuport_proto::v1::{NodeState, Verdict, VerdictKind, nft_statement};

const API: &str = "apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: api, namespace: apps}
spec:
  className: public
  protocol: TCP
  port: 9000
  serviceRef: {name: api, port: api}
";

/// Sets a mapping's spec.rateLimit.
fn limited(m: Manifests, ns: &str, name: &str, limit: RateLimit) -> Manifests {
    edit_port_map(m, ns, name, |s| s.rate_limit = Some(limit))
}

/// What one flood did: new flows sent, answers received, and how long the sending took.
struct Flood {
    sent: usize,
    answered: usize,
    took: Duration,
    /// The longest pause between two sends (paced floods only).
    longest_gap: Duration,
}

/// From `client`, `sockets` sockets each send one datagram to every port of `ports` at `to`:
/// each a new flow. Then every answer that comes within a second is counted.
fn flood(lab: &Lab, client: &str, to: &str, ports: (u16, u16), sockets: usize) -> Flood {
    let path = lab.netns(client).expect("the client's namespace");
    let to: IpAddr = to.parse().expect("an address");
    let any = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
    in_netns(&path, || {
        let socks: Vec<UdpSocket> = (0..sockets).map(|_| UdpSocket::bind(any)).collect::<Result<_, _>>()?;
        let start = Instant::now();
        let mut sent = 0;
        for s in &socks {
            for p in ports.0..=ports.1 {
                s.send_to(b"flood", SocketAddr::new(to, p))?;
                sent += 1;
            }
        }
        let took = start.elapsed();
        std::thread::sleep(Duration::from_secs(1));
        let mut answered = 0;
        let mut buf = [0u8; 2048];
        for s in &socks {
            s.set_nonblocking(true)?;
            while s.recv(&mut buf).is_ok() {
                answered += 1;
            }
        }
        Ok(Flood { sent, answered, took, longest_gap: Duration::ZERO })
    })
    .expect("the flood runs")
}

/// From `client`, `n` TCP connects to `to` at once, each on its own thread: `n` SYNs within
/// milliseconds. A dropped SYN is sent again only after a second, past the connect's timeout,
/// so what connects is what the limit let through. `took`: from the first SYN to the last.
fn syn_flood(lab: &Lab, client: &str, to: SocketAddr, n: usize) -> Flood {
    let path = lab.netns(client).expect("the client's namespace");
    in_netns(&path, || {
        // Threads made here are in the namespace too.
        let threads: Vec<_> = (0..n)
            .map(|_| {
                std::thread::spawn(move || {
                    let at = Instant::now();
                    (at, TcpStream::connect_timeout(&to, Duration::from_millis(700)).is_ok())
                })
            })
            .collect();
        let results: Vec<(Instant, bool)> = threads.into_iter().filter_map(|t| t.join().ok()).collect();
        let first = results.iter().map(|r| r.0).min();
        let last = results.iter().map(|r| r.0).max();
        let took = match (first, last) {
            (Some(a), Some(b)) => b - a,
            _ => Duration::ZERO,
        };
        let answered = results.iter().filter(|r| r.1).count();
        Ok(Flood { sent: results.len(), answered, took, longest_gap: Duration::ZERO })
    })
    .expect("the SYN flood runs")
}

/// From `client`, new flows to `to` at about `per_second` for `length`, each from a socket of its
/// own; then every answer that comes within a second is counted.
fn paced_flood(lab: &Lab, client: &str, to: SocketAddr, per_second: u32, length: Duration) -> Flood {
    let path = lab.netns(client).expect("the client's namespace");
    in_netns(&path, || {
        let gap = Duration::from_secs(1) / per_second;
        let start = Instant::now();
        let (mut last, mut longest_gap) = (start, Duration::ZERO);
        let mut socks = Vec::new();
        while start.elapsed() < length {
            let s = UdpSocket::bind("0.0.0.0:0")?;
            s.send_to(b"flood", to)?;
            socks.push(s);
            let now = Instant::now();
            longest_gap = longest_gap.max(now - last);
            last = now;
            std::thread::sleep(gap.saturating_sub(Duration::from_micros(50)));
        }
        let took = last - start;
        std::thread::sleep(Duration::from_secs(1));
        let mut buf = [0u8; 2048];
        let mut answered = 0;
        for s in &socks {
            s.set_nonblocking(true)?;
            while s.recv(&mut buf).is_ok() {
                answered += 1;
            }
        }
        Ok(Flood { sent: socks.len(), answered, took, longest_gap })
    })
    .expect("the paced flood runs")
}

/// A paced SYN flood as it ended: connects begun, connections answered, the time from the first
/// connect to the last, and the longest pause between two connects.
struct SynFlood {
    sent: usize,
    answered: usize,
    took: Duration,
    longest_gap: Duration,
}

/// How long a paced flood's connection is kept: under a second, so its SYN is never sent again
/// (the first retransmission of a SYN comes after 1 s) and each connection is one SYN.
const HOLD: Duration = Duration::from_millis(400);

/// From `client`, new TCP connections to `to` at about `per_second` for `length`, each a
/// non-blocking connect from a socket of its own. Each is closed `HOLD` after its SYN, its
/// answer read first: `answered` counts the connections whose answer from `pod` names the
/// client's address and the connection's own port.
fn paced_syn_flood(
    lab: &Lab,
    client: &str,
    to: SocketAddrV4,
    pod: &str,
    per_second: u32,
    length: Duration,
) -> SynFlood {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, connect, socket_with};
    let path = lab.netns(client).expect("the client's namespace");
    let own = client_address(lab, client);
    // The connections older than HOLD: each answered or abandoned, then closed.
    let settle = |open: &mut VecDeque<(TcpStream, Instant)>| {
        let mut answered = 0;
        while let Some((s, at)) = open.front() {
            if at.elapsed() < HOLD {
                break;
            }
            let mut buf = [0u8; 256];
            let text = (&*s).read(&mut buf).map(|n| String::from_utf8_lossy(&buf[..n]).into_owned());
            let port = s.local_addr().map(|a| a.port());
            if let (Ok(text), Ok(port)) = (text, port)
                && parse_answer(&text).is_some_and(|(p, seen)| p == pod && *seen.ip() == own && seen.port() == port)
            {
                answered += 1;
            }
            open.pop_front();
        }
        answered
    };
    in_netns(&path, || {
        let gap = Duration::from_secs(1) / per_second;
        let mut open = VecDeque::new();
        let (mut sent, mut answered) = (0, 0);
        let mut longest_gap = Duration::ZERO;
        let start = Instant::now();
        let mut last = start;
        while start.elapsed() < length {
            let fd = socket_with(AddressFamily::INET, SocketType::STREAM, SocketFlags::NONBLOCK, None)?;
            match connect(&fd, &to) {
                Ok(()) | Err(rustix::io::Errno::INPROGRESS) => {}
                Err(e) => return Err(e.into()),
            }
            let now = Instant::now();
            longest_gap = longest_gap.max(now - last);
            last = now;
            sent += 1;
            open.push_back((TcpStream::from(fd), now));
            answered += settle(&mut open);
            std::thread::sleep(gap.saturating_sub(Duration::from_micros(50)));
        }
        let took = last - start;
        while let Some((_, at)) = open.front() {
            std::thread::sleep(HOLD.saturating_sub(at.elapsed()));
            answered += settle(&mut open);
        }
        Ok(SynFlood { sent, answered, took, longest_gap })
    })
    .expect("the paced SYN flood runs")
}

/// In `pod`'s namespace, a counter of the SYNs that arrive from `from` for `port`: what the
/// limit let through, counted where it lands (a table of the test's own, not kuport's).
fn count_syns(lab: &Lab, pod: &str, from: Ipv4Addr, port: u16) {
    let rules = format!(
        "table inet paced {{\n chain input {{\n  type filter hook input priority 0;\n  \
         ip saddr {from} tcp dport {port} tcp flags & (syn | ack) == syn counter\n }}\n}}\n"
    );
    kuport_lab::sys::nft(&lab.netns_name(pod), &rules).expect("the pod's SYN counter loads");
}

/// The SYNs `count_syns` has counted.
fn syns(lab: &Lab, pod: &str) -> u64 {
    let out = lab.exec(pod, &["nft", "list", "chain", "inet", "paced", "input"]).expect("nft lists the counter");
    let w: Vec<&str> = out.split_whitespace().collect();
    w.iter().position(|w| *w == "packets").and_then(|i| w.get(i + 1)).and_then(|n| n.parse().ok()).expect("a count")
}

/// A TcpExt counter of `host`'s namespace (/proc/net/netstat: a line of names, one of values).
fn tcp_ext(lab: &Lab, host: &str, name: &str) -> u64 {
    let out = lab.exec(host, &["cat", "/proc/net/netstat"]).expect("the namespace's netstat");
    let mut lines = out.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next().unwrap_or_default(), lines.next().unwrap_or_default());
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no TcpExt {name} in {host}"))
}

/// client-1, well-behaved during a flood: a new flow (a socket of its own) to `to` every 100 ms,
/// a fifth of its own rate, each to be answered by `pod` within 900 ms. Under a second, so a
/// SYN the limit dropped, sent again only after one, makes its probe lost rather than late.
fn well_behaved(lab: &Lab, to: &str, protocol: Protocol, pod: &str) -> Prober {
    let target = Target {
        label: "client-1".into(),
        from: lab.netns("client-1").expect("client-1's namespace"),
        client: client_address(lab, "client-1"),
        to: addr(to),
        protocol,
        flow: Flow::New,
        pod: pod.into(),
    };
    Prober::start(vec![target], Duration::from_millis(100), Duration::from_millis(900))
}

/// Stops client-1's stream: every probe it sent was answered, by the pod, with its address.
fn assert_served(mut p: Prober, flood: Duration) {
    p.stop();
    let all = p.tally("client-1", Duration::ZERO, p.now());
    eprintln!("client-1 during the flood: {all}");
    let least = (flood.as_secs_f64() * 10.0 * 0.7) as usize;
    assert!(
        all.failed() == 0 && all.answered >= least,
        "client-1 during the flood: {all} (at least {least} to send), first failure {:?}",
        p.first_failure("client-1", Duration::ZERO, p.now())
    );
}

/// From `client`, one UDP datagram to `to` from each of `n` forged source addresses from
/// 198.18.0.0/15 (RFC 2544's benchmark range), through a raw socket: `n` clients as the
/// kernel's per-source state sees them.
fn spoofed_flood(lab: &Lab, client: &str, to: SocketAddrV4, n: u32) -> usize {
    use rustix::net::{AddressFamily, SendFlags, SocketType, ipproto, sendto, socket};
    let path = lab.netns(client).expect("the client's namespace");
    in_netns(&path, || {
        // IPPROTO_RAW: the header is ours; the kernel fills its checksum.
        let fd = socket(AddressFamily::INET, SocketType::RAW, Some(ipproto::RAW))?;
        let mut sent = 0;
        for i in 0..n {
            let from = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i);
            let mut packet = vec![0x45, 0, 0, 33, 0, 0, 0, 0, 64, 17, 0, 0];
            packet[4..6].copy_from_slice(&(i as u16).to_be_bytes());
            packet.extend_from_slice(&from.octets());
            packet.extend_from_slice(&to.ip().octets());
            // UDP: ports, length, no checksum (allowed over IPv4), payload.
            packet.extend_from_slice(&40_000u16.to_be_bytes());
            packet.extend_from_slice(&to.port().to_be_bytes());
            packet.extend_from_slice(&13u16.to_be_bytes());
            packet.extend_from_slice(&[0, 0]);
            packet.extend_from_slice(b"spoof");
            if sendto(&fd, &packet, SendFlags::empty(), &to).is_ok() {
                sent += 1;
            }
        }
        Ok(sent)
    })
    .expect("the spoofed flood runs")
}

/// The clients `node`'s rate set of `set` tracks now.
fn tracked(lab: &Lab, node: &str, set: &str) -> usize {
    let out = lab.exec(node, &["nft", "list", "set", "inet", "kuport", set]).expect("nft lists the set");
    out.matches("limit rate over").count()
}

/// The packets the rate rules of `node`'s limit chains dropped.
fn rate_drops(lab: &Lab, node: &str) -> u64 {
    let out = lab.exec(node, &["nft", "list", "table", "inet", "kuport"]).expect("nft lists the table");
    out.lines()
        .filter(|l| l.contains("update @rate"))
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            // The counter's, the last: the limit says "burst N packets" before it.
            w.iter().rposition(|w| *w == "packets").and_then(|i| w.get(i + 1)).and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

/// Removes the dispatch to the limit chains from `node`'s steering chain: the ablation.
fn without_limits(states: &mut BTreeMap<String, std::sync::Arc<NodeState>>, node: &str) -> usize {
    drop_rules(host_state(states, node), "kup-steer", |r| {
        r.statements
            .iter()
            .any(|s| matches!(&s.kind, Some(nft_statement::Kind::VerdictMap(v)) if v.map.starts_with("limit")))
    })
}

const GAME_PORTS: (u16, u16) = (27015, 27115);
const RATE: u32 = 50;
const BURST: u32 = 10;

/// The most a bucket of `RATE` per second and `BURST` lets through while a flood of `took` is
/// sent, with a tenth and five flows to spare for the kernel's clock.
fn bound(took: Duration) -> usize {
    (f64::from(BURST) + f64::from(RATE) * took.as_secs_f64() * 1.1 + 5.0) as usize
}

/// The default lab with the game's range limited to RATE and BURST and edited by `edit`,
/// programmed and applied.
fn game_at_the_rate(edit: impl FnOnce(&mut PortMapSpec)) -> (Lab, Outputs) {
    let mut lab = default_lab();
    let limit = RateLimit { new_per_second: RATE, burst: Some(BURST), max_connections: None };
    let m = edit_port_map(limited(Manifests::default_lab(), "games", "game", limit), "games", "game", edit);
    let out = compute(&mut lab, &m);
    let programmed = condition(&out, "games", "game", "Programmed").0;
    assert_eq!(programmed, "True", "{}", message(&out, "games", "game", "Programmed"));
    apply(&mut lab, &out.node_states).expect("the state applies");
    (lab, out)
}

#[test]
fn a_flood_of_new_udp_flows_from_one_client_is_held_to_its_rate() {
    if !root() {
        return;
    }
    let (mut lab, mut out) = game_at_the_rate(|_| {});
    assert_maps_any(&lab, "client-1", "203.0.113.9:27015", Udp, "game-0");

    // client-2's flood: 2,020 new flows, as fast as it can send them.
    let before = rate_drops(&lab, "edge-a");
    let f = flood(&lab, "client-2", "203.0.113.9", GAME_PORTS, 20);
    let max = bound(f.took);
    eprintln!("flood: {} flows in {:?}, {} answered (bound {max})", f.sent, f.took, f.answered);
    assert!(f.answered >= 1 && f.answered <= max, "{} of {} flows answered, bound {max}", f.answered, f.sent);
    let dropped = rate_drops(&lab, "edge-a") - before;
    assert!(dropped as usize >= f.sent - max, "each flow over the rate counted: {dropped} of {}", f.sent);

    // client-1 has its own bucket; client-2's refills within a second.
    assert_maps_any(&lab, "client-1", "203.0.113.9:27115", Udp, "game-0");
    std::thread::sleep(Duration::from_secs(1));
    assert_maps_any(&lab, "client-2", "203.0.113.9:27016", Udp, "game-0");

    // A flood held for two seconds at about 1,000 new flows per second: what passes, counted by
    // game-0's answers (one per flow at most), is the burst and the rate over the time from the
    // first flow to the last, within a tenth (issue 29). client-1 sends a new flow every 100 ms
    // throughout, and every one is answered.
    std::thread::sleep(Duration::from_secs(1));
    let to: SocketAddr = "203.0.113.9:27015".parse().expect("an address");
    let served = well_behaved(&lab, "203.0.113.9:27015", Udp, "game-0");
    let f = paced_flood(&lab, "client-2", to, 1000, Duration::from_secs(2));
    assert_served(served, f.took);
    let expected = f64::from(BURST) + f64::from(RATE) * f.took.as_secs_f64();
    let share = f.answered as f64 / expected;
    eprintln!(
        "paced flood: {} flows in {:?} (longest pause {:?}), {} answered, {share:.3} of burst + rate x time",
        f.sent, f.took, f.longest_gap, f.answered
    );
    assert!(f.sent as f64 > 5.0 * expected, "the flood outran the rate: {} flows", f.sent);
    assert!(
        (share - 1.0).abs() <= 0.1,
        "flows answered by game-0: {} of {}, {expected:.1} expected (burst {BURST} + {RATE}/s x {:?}), share {share:.3}, \
         longest pause {:?} (one over burst / rate loses tokens)",
        f.answered,
        f.sent,
        f.took,
        f.longest_gap
    );

    // The same over IPv6, with its own buckets.
    assert_maps_any(&lab, "client-1", "[2001:db8::9]:27015", Udp, "game-0");
    let f = flood(&lab, "client-2", "2001:db8::9", GAME_PORTS, 20);
    let max = bound(f.took);
    eprintln!("IPv6 flood: {} flows in {:?}, {} answered (bound {max})", f.sent, f.took, f.answered);
    assert!(f.answered >= 1 && f.answered <= max, "IPv6: {} of {} flows answered, bound {max}", f.answered, f.sent);
    assert_maps_any(&lab, "client-1", "[2001:db8::9]:27115", Udp, "game-0");

    // Ablation: without the dispatch, the flood reaches game-0.
    assert_eq!(without_limits(&mut out.node_states, "edge-a"), 2, "the range's rule, both families");
    apply(&mut lab, &out.node_states).expect("the ablated state applies");
    let f = flood(&lab, "client-2", "203.0.113.9", GAME_PORTS, 20);
    assert!(f.answered > 3 * bound(f.took), "without the rule {} of {} flows are answered", f.answered, f.sent);
    let f = paced_flood(&lab, "client-2", to, 1000, Duration::from_secs(2));
    eprintln!("paced flood without the rule: {} flows in {:?}, {} answered", f.sent, f.took, f.answered);
    assert!(f.answered > 3 * bound(f.took), "without the rule {} of {} paced flows are answered", f.answered, f.sent);
}

/// `n` TCP connections from `client` to the API's published port, held until dropped.
fn connect(lab: &Lab, client: &str, n: usize) -> Vec<std::io::Result<TcpStream>> {
    let to: SocketAddr = "203.0.113.9:9000".parse().expect("an address");
    let path = lab.netns(client).expect("the client's namespace");
    in_netns(&path, || Ok((0..n).map(|_| TcpStream::connect_timeout(&to, Duration::from_secs(2))).collect()))
        .expect("the connects run")
}

/// 100,000 forged sources, each a new client with a full bucket: the per-source state stays
/// within its bound (steer.rs, TRACKED_CLIENTS), and the set, full, tracks no newcomer: the
/// limit fails open for them, so the well-behaved client is still served.
#[test]
fn a_flood_from_a_hundred_thousand_forged_sources_leaves_the_state_bounded() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let limit = RateLimit { new_per_second: RATE, burst: Some(BURST), max_connections: None };
    let out = compute(&mut lab, &limited(Manifests::default_lab(), "games", "game", limit));
    apply(&mut lab, &out.node_states).expect("the state applies");
    let to: SocketAddrV4 = "203.0.113.9:27015".parse().expect("an address");
    let sent = spoofed_flood(&lab, "client-2", to, 100_000);
    assert_eq!(sent, 100_000, "the raw socket sent every datagram");
    let held = tracked(&lab, "edge-a", "rate");
    let bound = TRACKED_CLIENTS as usize;
    eprintln!("100,000 forged sources: {held} tracked (bound {bound})");
    assert!(held > bound / 2 && held <= bound, "{held} clients tracked, bound {bound}");
    assert_maps_any(&lab, "client-1", "203.0.113.9:27015", Udp, "game-0");
}

/// Multi: every accepting node holds a client to the mapping's rate, each with its own buckets.
#[test]
fn multi_every_accepting_node_holds_a_flood_to_the_rate() {
    if !root() {
        return;
    }
    let mut lab = Lab::up(&kuport_lab::topology::Topology::multi_lab()).expect("the Multi lab builds");
    let limit = RateLimit { new_per_second: RATE, burst: Some(BURST), max_connections: None };
    let dns = Manifests::multi_lab()
        .cluster
        .port_maps
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("dns"))
        .map(|p| p.spec.protocol);
    assert_eq!(dns, Some(kuport_controller::api::Protocol::Udp), "the Multi lab's dns mapping is UDP");
    let mut out = compute(&mut lab, &limited(Manifests::multi_lab(), "intranet", "dns", limit));
    apply(&mut lab, &out.node_states).expect("the state applies");
    for (i, worker) in ["worker-1", "worker-2", "worker-3"].iter().enumerate() {
        let address = format!("100.64.0.1{}", i + 1);
        assert_maps_any(&lab, "client-1", &format!("{address}:5353"), Udp, "dns-0");
        let f = flood(&lab, "client-2", &address, (5353, 5353), 400);
        let max = bound(f.took);
        eprintln!("{worker}: {} flows in {:?}, {} answered (bound {max})", f.sent, f.took, f.answered);
        assert!(f.answered >= 1 && f.answered <= max, "{worker}: {} of {} answered, bound {max}", f.answered, f.sent);
        assert_maps_any(&lab, "client-1", &format!("{address}:5353"), Udp, "dns-0");
    }
    // Ablation on worker-1: its flood reaches dns-0.
    assert_eq!(without_limits(&mut out.node_states, "worker-1"), 2, "one rule per family");
    apply(&mut lab, &out.node_states).expect("the ablated state applies");
    let f = flood(&lab, "client-2", "100.64.0.11", (5353, 5353), 400);
    assert!(f.answered > 3 * bound(f.took), "without the rule {} of {} flows are answered", f.answered, f.sent);
}

#[test]
fn a_flood_of_tcp_syns_from_one_client_is_held_to_its_rate() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let m = Manifests::default_lab().add("api.yaml", API).expect("the api mapping loads");
    let limit = RateLimit { new_per_second: RATE, burst: Some(BURST), max_connections: None };
    let mut out = compute(&mut lab, &limited(m, "apps", "api", limit));
    apply(&mut lab, &out.node_states).expect("the state applies");

    let before = rate_drops(&lab, "edge-a");
    let f = syn_flood(&lab, "client-2", "203.0.113.9:9000".parse().expect("an address"), 200);
    let max = bound(f.took);
    eprintln!("SYN flood: {} connects in {:?}, {} connected (bound {max})", f.sent, f.took, f.answered);
    assert!(f.answered >= 1 && f.answered <= max, "{} of {} connected, bound {max}", f.answered, f.sent);
    let dropped = rate_drops(&lab, "edge-a") - before;
    assert!(dropped as usize >= f.sent - max, "each SYN over the rate counted: {dropped} of {}", f.sent);
    assert_maps_any(&lab, "client-1", "203.0.113.9:9000", Tcp, "api-0");

    // SYNs held for two seconds at about 1,000 new connections per second. Measured where they
    // land: the SYNs from client-2 that reach api-0, counted in its namespace. No SYN is sent
    // twice (each connection is closed before a retransmission, and client-2's TCPSynRetrans
    // stays put), so each is a distinct connection; and each was accepted and answered by
    // api-0's server. That count is the burst and the rate over the time from the first SYN to
    // the last, within a tenth (issue 29). client-1 connects every 100 ms throughout, and every
    // connection is answered.
    let client2 = client_address(&lab, "client-2");
    count_syns(&lab, "api-0", client2, 9000);
    let to = addr("203.0.113.9:9000");
    let paced = |lab: &Lab| {
        std::thread::sleep(Duration::from_secs(1));
        let (syns_before, retrans_before) = (syns(lab, "api-0"), tcp_ext(lab, "client-2", "TCPSynRetrans"));
        let f = paced_syn_flood(lab, "client-2", to, "api-0", 1000, Duration::from_secs(2));
        let retransmitted = tcp_ext(lab, "client-2", "TCPSynRetrans") - retrans_before;
        assert_eq!(retransmitted, 0, "client-2 sent no SYN twice");
        (f, (syns(lab, "api-0") - syns_before) as usize)
    };
    let served = well_behaved(&lab, "203.0.113.9:9000", Tcp, "api-0");
    let (f, reached) = paced(&lab);
    assert_served(served, f.took);
    let expected = f64::from(BURST) + f64::from(RATE) * f.took.as_secs_f64();
    let share = reached as f64 / expected;
    eprintln!(
        "paced SYN flood: {} connects in {:?} (longest pause {:?}), {reached} SYNs reached api-0, \
         {} answered, {share:.3} of burst + rate x time",
        f.sent, f.took, f.longest_gap, f.answered
    );
    assert!(f.sent as f64 > 5.0 * expected, "the flood outran the rate: {} connects", f.sent);
    assert!(
        (share - 1.0).abs() <= 0.1,
        "SYNs from client-2 that reached api-0: {reached} of {}, {expected:.1} expected \
         (burst {BURST} + {RATE}/s x {:?}), share {share:.3}, longest pause {:?} (one over burst / rate loses tokens)",
        f.sent,
        f.took,
        f.longest_gap
    );
    assert_eq!(f.answered, reached, "every SYN that reached api-0 was a connection its server answered");

    // Ablation: without the dispatch, every connect succeeds, and the paced SYNs reach api-0.
    assert_eq!(without_limits(&mut out.node_states, "edge-a"), 2, "the single port's rule, both families");
    apply(&mut lab, &out.node_states).expect("the ablated state applies");
    std::thread::sleep(Duration::from_secs(1));
    let f = syn_flood(&lab, "client-2", to.into(), 200);
    assert!(f.answered > 3 * bound(f.took), "without the rule {} of {} connect", f.answered, f.sent);
    let (f, reached) = paced(&lab);
    eprintln!("paced SYN flood without the rule: {} connects in {:?}, {reached} reached api-0", f.sent, f.took);
    assert!(reached > 3 * bound(f.took), "without the rule {reached} of {} paced SYNs reach api-0", f.sent);
}

#[test]
fn a_client_holds_no_more_connections_than_the_cap() {
    if !root() {
        return;
    }
    let mut lab = default_lab();
    let m = Manifests::default_lab().add("api.yaml", API).expect("the api mapping loads");
    let limit = RateLimit { new_per_second: 100, burst: None, max_connections: Some(3) };
    let m = limited(m, "apps", "api", limit);
    let mut out = compute(&mut lab, &m);
    apply(&mut lab, &out.node_states).expect("the state applies");
    // Three held connections; the fourth gets no answer. Another client is not affected.
    let held = connect(&lab, "client-2", 4);
    let open = held.iter().filter(|c| c.is_ok()).count();
    assert_eq!(open, 3, "{held:?}");
    assert_maps_any(&lab, "client-1", "203.0.113.9:9000", Tcp, "api-0");
    drop(held);

    // Ablation: without the dispatch, a client holds as many as it opens.
    assert_eq!(without_limits(&mut out.node_states, "edge-a"), 2, "the single port's rule, both families");
    apply(&mut lab, &out.node_states).expect("the ablated state applies");
    let held = connect(&lab, "client-2", 4);
    assert_eq!(held.iter().filter(|c| c.is_ok()).count(), 4, "{held:?}");
}

/// A mapping with an allow-list and a rate limit: its guard chain sends what it admits on to its
/// limit chain, so new connections pay one dispatch lookup, not two (docs/portmap/guard.md,
/// "One dispatch for both"). The limit holds through that path, in both families; the
/// ablation: with the guard chains' `goto` turned back into a plain `return`, nothing leads to
/// the limit chain and the flood reaches game-0.
#[test]
fn an_allow_listed_client_is_held_to_its_rate_through_the_guard_chain() {
    if !root() {
        return;
    }
    let (mut lab, mut out) = game_at_the_rate(|s| {
        s.source_ranges = vec!["198.51.100.0/24".into(), "2001:db8:100::/48".into()];
    });
    let listing = lab.exec("edge-a", &["nft", "list", "table", "inet", "kuport"]).expect("nft lists the table");
    assert!(!listing.contains("@limit_range"), "no limit dispatch: the guard chain leads there\n{listing}");
    assert!(listing.contains("ip saddr 198.51.100.0/24 goto kup-limit-"), "{listing}");
    assert!(listing.contains("ip6 saddr 2001:db8:100::/48 goto kup-limit6-"), "{listing}");
    assert_maps_any(&lab, "client-1", "203.0.113.9:27015", Udp, "game-0");

    for to in ["203.0.113.9", "2001:db8::9"] {
        let before = rate_drops(&lab, "edge-a");
        let f = flood(&lab, "client-2", to, GAME_PORTS, 20);
        let max = bound(f.took);
        eprintln!("{to}: {} flows in {:?}, {} answered (bound {max})", f.sent, f.took, f.answered);
        assert!(f.answered >= 1 && f.answered <= max, "{to}: {} of {} answered, bound {max}", f.answered, f.sent);
        let dropped = rate_drops(&lab, "edge-a") - before;
        assert!(dropped as usize >= f.sent - max, "{to}: each flow over the rate counted: {dropped} of {}", f.sent);
        let client_1 = if to.contains(':') { format!("[{to}]:27115") } else { format!("{to}:27115") };
        assert_maps_any(&lab, "client-1", &client_1, Udp, "game-0");
    }

    // Ablation: the admitted go back to kup-steer instead of on to the limit chain.
    let mut turned = 0;
    let t = kuport_table(host_state(&mut out.node_states, "edge-a"));
    for c in t.chains.iter_mut().filter(|c| c.name.starts_with("kup-guard")) {
        for s in c.rules.iter_mut().flat_map(|r| &mut r.statements) {
            if let Some(nft_statement::Kind::Verdict(v)) = &mut s.kind
                && v.kind == VerdictKind::Goto as i32
            {
                *v = Verdict { kind: VerdictKind::Return as i32, chain: String::new() };
                turned += 1;
            }
        }
    }
    assert!(turned >= 2, "a prefix per family and interface: {turned}");
    apply(&mut lab, &out.node_states).expect("the ablated state applies");
    let f = flood(&lab, "client-2", "203.0.113.9", GAME_PORTS, 20);
    assert!(f.answered > 3 * bound(f.took), "without the goto {} of {} flows are answered", f.answered, f.sent);
}
