//! Root tests of the executor's WireGuard step against a real kernel, on whichever backend the
//! executor picks: the kernel's where it has WireGuard (Debian's kernel under QEMU,
//! e2e/vm/wireguard.sh, which sets KUPORT_WIREGUARD=kernel so that a fallback fails the tests),
//! `wireguard-go` elsewhere (this host's kernel has no WireGuard module; picked automatically
//! once the kernel refuses the link type). Each test builds scratch namespaces joined by veth
//! pairs as the underlay, one WireGuard device per namespace; the oracles are `wg show IFACE
//! dump` and UDP echoes between the overlay addresses (a socket in each namespace: no ping on
//! CI). What only wireguard-go has (a daemon to kill) is skipped on the kernel, saying so.
//! Interface names are unique per test: wireguard-go's UAPI sockets share one folder across all
//! namespaces. Without root they fail, unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/host.rs"]
mod host;
#[path = "common/netns.rs"]
mod netns;
use netns::Netns;
#[path = "common/wg_dump.rs"]
mod wg_dump;
use wg_dump::{Dump, sorted};
#[path = "common/keeper.rs"]
mod keeper;
use host::{root, run};
use keeper::Keeper;

use std::collections::BTreeSet;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kuport_node_exec::executor::{Executor, WIREGUARD_POLL};
use kuport_node_exec::wireguard::{self, BackendKind, Options, Wireguard};
use kuport_proto::v1::{Address, NetnsState, Route, WireguardDevice, WireguardPeer};

const PORT: u32 = 51820;
const KEEPALIVE: u32 = 25;
/// Not wireguard-go's own 1420, so that the test sees the executor set it.
const MTU: u32 = 1380;

fn unique() -> usize {
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

impl Netns {
    fn exec(&self, args: &[&str]) -> std::process::Output {
        let mut all = vec!["netns", "exec", &self.name];
        all.extend_from_slice(args);
        Command::new("ip").args(&all).output().expect("ip netns exec")
    }

    fn pids(&self) -> Vec<String> {
        run("ip", &["netns", "pids", &self.name]).split_whitespace().map(String::from).collect()
    }
}

/// One simulated node: its namespace, state directory, device name and WireGuard.
struct Node {
    ns: Netns,
    dir: PathBuf,
    dev: String,
    /// Its underlay address as the others reach it (one veth per pair: per peer).
    index: u8,
}

impl Node {
    fn wireguard(&self) -> Arc<Wireguard> {
        Arc::new(Wireguard::load(&self.dir, Options::default()).expect("the node's key"))
    }

    fn executor(&self) -> Executor {
        Executor::new(Some(self.ns.path())).with_wireguard(self.wireguard())
    }

    fn overlay(&self) -> String {
        format!("100.96.0.{}", self.index)
    }

    fn pods(&self) -> String {
        format!("10.42.{}.0/24", self.index)
    }

    /// `wg show DEV dump`, run inside the namespace: the device line and one line per peer.
    fn dump(&self) -> Dump {
        let out = self.ns.exec(&["wg", "show", &self.dev, "dump"]);
        Dump::parse(&out, &self.dev)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the tests must run on the kernel backend (e2e/vm/wireguard.sh says so).
fn kernel_required() -> bool {
    std::env::var("KUPORT_WIREGUARD").as_deref() == Ok("kernel")
}

/// The backend running `node`'s device, by its link's kind (`ip -d link`); the kernel's when
/// [`kernel_required`].
fn backend(node: &Node) -> BackendKind {
    let link = node.ns.ip(&["-d", "-o", "link", "show", &node.dev]);
    let kind = link
        .split_whitespace()
        .find_map(|w| BackendKind::of_link_kind(Some(w)))
        .unwrap_or_else(|| panic!("no WireGuard link kind in {link}"));
    assert!(!kernel_required() || kind == BackendKind::Kernel, "KUPORT_WIREGUARD=kernel, but {link}");
    kind
}

/// Whether a datagram from `from` reaches `to`'s overlay address and its echo comes back.
fn reach(from: &Node, to: &Node) -> bool {
    reach_at(&from.ns, &to.ns, to.overlay().parse().expect("overlay address"))
}

/// Whether a datagram from namespace `from` reaches `addr` in namespace `to` and its echo
/// comes back.
fn reach_at(from: &Netns, to: &Netns, addr: std::net::Ipv4Addr) -> bool {
    use kuport_node_exec::sys::{self, netns};
    let port = 20000 + (unique() % 20000) as u16;
    let (tx, rx) = std::sync::mpsc::channel();
    let served = netns::spawn(
        Some(&to.path()),
        "echo",
        move || {
            let s = UdpSocket::bind(("0.0.0.0", port)).map_err(sys::Error::Receive)?;
            s.set_read_timeout(Some(Duration::from_millis(1500))).map_err(sys::Error::Receive)?;
            Ok::<_, sys::Error>(s)
        },
        move |s| {
            let mut buf = [0u8; 64];
            let echoed = match s.recv_from(&mut buf) {
                Ok((n, peer)) => s.send_to(&buf[..n], peer).is_ok(),
                Err(_) => false,
            };
            let _ = tx.send(echoed);
        },
    );
    if served.is_err() {
        return false;
    }
    let answered = netns::run(Some(&from.path()), move || {
        let c = UdpSocket::bind("0.0.0.0:0").map_err(sys::Error::Receive)?;
        c.set_read_timeout(Some(Duration::from_millis(1000))).map_err(sys::Error::Receive)?;
        c.send_to(b"kuport", (addr, port)).map_err(sys::Error::Send)?;
        let mut buf = [0u8; 64];
        Ok::<_, sys::Error>(matches!(c.recv_from(&mut buf), Ok((6, _))) && &buf[..6] == b"kuport")
    });
    let echoed = rx.recv_timeout(Duration::from_secs(3)).unwrap_or(false);
    answered.unwrap_or(false) && echoed
}

/// A pod on `node`: a namespace joined to the node's by a veth, 10.42.I.2/24 with its default
/// route through the node's 10.42.I.1 (I the node's index), the node forwarding, as a bridge CNI
/// would make it. The pod's /24 is among the node's allowed IPs on every peer.
fn pod(node: &Node) -> (Netns, std::net::Ipv4Addr) {
    let pod = Netns::new("wgpod", "");
    let (i, host_end) = (node.index, format!("pod{}", node.index));
    let ns = (&node.ns.name, &pod.name);
    run("ip", &["link", "add", &host_end, "netns", ns.0, "type", "veth", "peer", "name", "eth0", "netns", ns.1]);
    node.ns.ip(&["addr", "add", &format!("10.42.{i}.1/24"), "dev", &host_end]);
    node.ns.ip(&["link", "set", &host_end, "up"]);
    run("ip", &["netns", "exec", ns.0, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]);
    pod.ip(&["addr", "add", &format!("10.42.{i}.2/24"), "dev", "eth0"]);
    pod.ip(&["link", "set", "eth0", "up"]);
    pod.ip(&["route", "add", "default", "via", &format!("10.42.{i}.1")]);
    (pod, std::net::Ipv4Addr::new(10, 42, i, 2))
}

/// `n` nodes, every pair joined by a veth pair on 192.168.{i}{j}.0/24 (i < j): node i is
/// 192.168.ij.i, node j 192.168.ij.j.
fn mesh(n: u8) -> Vec<Node> {
    let tag = std::process::id() % 10000;
    let test = unique();
    let nodes: Vec<Node> = (1..=n)
        .map(|index| Node {
            ns: Netns::new("wg", ""),
            dir: std::env::temp_dir().join(format!("kuport-wg-{}-{test}-{index}", std::process::id())),
            dev: format!("kup-w{tag}{test}{index}"),
            index,
        })
        .collect();
    for i in 0..nodes.len() {
        for j in i + 1..nodes.len() {
            let (a, b) = (&nodes[i], &nodes[j]);
            let (va, vb) = (format!("u{}{}", a.index, b.index), format!("u{}{}", b.index, a.index));
            run(
                "ip",
                &["link", "add", &va, "netns", &a.ns.name, "type", "veth", "peer", "name", &vb, "netns", &b.ns.name],
            );
            for (node, dev) in [(a, &va), (b, &vb)] {
                node.ns.ip(&["addr", "add", &format!("{}/24", underlay(a, b, node)), "dev", dev]);
                node.ns.ip(&["link", "set", dev, "up"]);
            }
        }
    }
    nodes
}

/// `node`'s address on the pair (a, b).
fn underlay(a: &Node, b: &Node, node: &Node) -> String {
    let (lo, hi) = (a.index.min(b.index), a.index.max(b.index));
    format!("192.168.{lo}{hi}.{}", node.index)
}

/// The state of `node` in `all`: its device with every other node as a peer (allowed IPs: its
/// overlay /32 and pod /24; its underlay address on the pair), the overlay address, the routes.
fn state(node: &Node, all: &[Node], keys: &[String]) -> NetnsState {
    let peers = all
        .iter()
        .zip(keys)
        .filter(|(n, _)| n.index != node.index)
        .map(|(peer, key)| WireguardPeer {
            public_key: key.clone(),
            endpoint: format!("{}:{PORT}", underlay(node, peer, peer)),
            allowed_ips: vec![format!("{}/32", peer.overlay()), peer.pods()],
            persistent_keepalive_seconds: KEEPALIVE,
            ..Default::default()
        })
        .collect();
    let mut s = NetnsState {
        wireguard_devices: vec![WireguardDevice {
            name: node.dev.clone(),
            mtu: MTU,
            listen_port: PORT,
            fwmark: 0,
            peers,
        }],
        addresses: vec![Address { dev: node.dev.clone(), cidr: format!("{}/32", node.overlay()) }],
        routes: vec![
            Route { table: 254, dst: "100.96.0.0/24".into(), via: String::new(), dev: node.dev.clone() },
            Route { table: 254, dst: "10.42.0.0/16".into(), via: String::new(), dev: node.dev.clone() },
        ]
        .into(),
        ..Default::default()
    };
    let mut whole = kuport_proto::v1::NodeState { node: String::new(), netns: vec![s] };
    kuport_proto::canonicalize(&mut whole);
    s = whole.netns.remove(0);
    s
}

fn keys(nodes: &[Node]) -> Vec<String> {
    nodes.iter().map(|n| n.wireguard().public_key().to_string()).collect()
}

fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn apply(ex: &mut Executor, s: &NetnsState) -> usize {
    let r = ex.apply(s).unwrap_or_else(|e| panic!("apply: {e}"));
    r.writes
}

/// The peers of `s`'s device as `wg show dump` lists them.
fn expected_peers(s: &NetnsState) -> BTreeSet<(String, String, String, String)> {
    s.wireguard_devices[0]
        .peers
        .iter()
        .map(|p| {
            (
                p.public_key.clone(),
                p.endpoint.clone(),
                sorted(&p.allowed_ips.join(",")),
                p.persistent_keepalive_seconds.to_string(),
            )
        })
        .collect()
}

/// Applies every node's state and waits until every pair reaches the other over the overlay.
fn bring_up(nodes: &[Node]) -> (Vec<Executor>, Vec<NetnsState>) {
    let keys = keys(nodes);
    let mut exs = Vec::new();
    let mut states = Vec::new();
    for n in nodes {
        let s = state(n, nodes, &keys);
        let mut ex = n.executor();
        assert!(apply(&mut ex, &s) > 0);
        exs.push(ex);
        states.push(s);
    }
    println!("backend: {}", backend(&nodes[0]));
    for a in nodes {
        for b in nodes.iter().filter(|b| b.index != a.index) {
            let start = Instant::now();
            while !reach(a, b) {
                if start.elapsed() > Duration::from_secs(10) {
                    let show = |n: &Node| {
                        let wg = n.ns.exec(&["wg", "show", &n.dev, "dump"]);
                        format!(
                            "{}\n{}\n{}",
                            n.ns.ip(&["addr"]),
                            n.ns.ip(&["route"]),
                            String::from_utf8_lossy(&wg.stdout)
                        )
                    };
                    panic!("{} does not reach {} over the overlay:\n{}\n{}", a.index, b.overlay(), show(a), show(b));
                }
            }
        }
    }
    (exs, states)
}

#[test]
fn a_mesh_of_three_carries_traffic_and_wg_shows_exactly_the_state() {
    if !root() {
        return;
    }
    let nodes = mesh(3);
    let (mut exs, states) = bring_up(&nodes);
    let keys = keys(&nodes);
    for ((n, s), key) in nodes.iter().zip(&states).zip(&keys) {
        let d = n.dump();
        assert_eq!(&d.device[1], key, "the device holds the node's key");
        assert_eq!(d.device[2], PORT.to_string());
        assert_eq!(d.peer_set(), expected_peers(s), "wg show {} dump", n.dev);
        assert!(n.ns.ip(&["-o", "link", "show", &n.dev]).contains(&format!("mtu {MTU} ")));
        // Applying the same state again writes nothing.
        let mut fresh = n.executor();
        assert_eq!(apply(&mut fresh, s), 0, "a second executor finds everything in place");
    }
    // Pod to pod across every pair, both ways, with the pods' own addresses (WireGuard lets in
    // only a peer's allowed IPs, so a source address the mesh changed would be dropped).
    let pods: Vec<_> = nodes.iter().map(pod).collect();
    for (a, (pa, _)) in nodes.iter().zip(&pods) {
        for (b, (pb, addr)) in nodes.iter().zip(&pods).filter(|(b, _)| b.index != a.index) {
            wait_until(&format!("pod {} reaches pod {} ({addr})", a.index, b.index), Duration::from_secs(10), || {
                reach_at(pa, pb, *addr)
            });
        }
    }
    // The echoes went through WireGuard: 2's counters for 1 grow with one more.
    let before = nodes[1].dump().rx(&keys[0]);
    assert!(reach(&nodes[0], &nodes[1]));
    assert!(nodes[1].dump().rx(&keys[0]) > before);
    // The backend reads back what `wg show` shows: key, port, peers, handshakes and counters.
    for n in &nodes {
        let (first, wg) = (n.dump(), n.wireguard());
        let read = wireguard::show(&wg, Some(&n.ns.path()), &n.dev).expect("read").expect("a device");
        let last = n.dump();
        assert_eq!(read.public_key.map(|k| k.to_string()).as_ref(), Some(&first.device[1]));
        assert_eq!(read.listen_port.to_string(), first.device[2]);
        assert_eq!(read.peers.len(), first.peers.len());
        for p in &read.peers {
            let key = p.public_key.to_string();
            let shown = first.peer(&key).unwrap_or_else(|| panic!("peer {key} not in wg show"));
            let ips: Vec<String> = p.allowed_ips.iter().map(|ip| ip.to_string()).collect();
            assert_eq!(p.endpoint.map(|e| e.to_string()).as_ref(), Some(&shown[2]), "{key}");
            assert_eq!(sorted(&ips.join(",")), sorted(&shown[3]), "{key}");
            assert_eq!(p.keepalive.to_string(), shown[7], "{key}");
            let handshake = p.last_handshake.map_or(0, |d| d.as_secs());
            assert!(handshake > 0, "{key} has a session");
            assert!(first.handshake(&key) <= handshake && handshake <= last.handshake(&key), "{key}: {p:?}");
            let (rx0, tx0) = first.bytes(&key);
            let (rx1, tx1) = last.bytes(&key);
            assert!(rx0 <= p.rx_bytes && p.rx_bytes <= rx1 && rx0 > 0, "{key}: {p:?}");
            assert!(tx0 <= p.tx_bytes && p.tx_bytes <= tx1 && tx0 > 0, "{key}: {p:?}");
        }
    }
    // The device leaves the state: its link (and the daemon) go.
    let empty = NetnsState::default();
    apply(&mut exs[0], &empty);
    wait_until("the daemon ends with its link", Duration::from_secs(3), || nodes[0].ns.pids().is_empty());
    assert!(!nodes[0].ns.ip(&["-o", "link", "show"]).contains(&nodes[0].dev));
    assert!(!Path::new(&format!("/var/run/wireguard/{}.sock", nodes[0].dev)).exists());
}

#[test]
fn changing_one_peer_leaves_the_others_session_alone_and_a_device_wide_replace_would_not() {
    if !root() {
        return;
    }
    let nodes = mesh(3);
    let (mut exs, states) = bring_up(&nodes);
    let keys = keys(&nodes);
    let (a, c_key, b_key) = (&nodes[0], &keys[2], &keys[1]);
    let before = a.dump();
    let (hs, rx) = (before.handshake(c_key), before.rx(c_key));
    assert!(hs > 0 && rx > 0, "a has a session with c");
    std::thread::sleep(Duration::from_millis(1100));

    // b's allowed IPs change on a: only b's entry is written.
    let mut changed = states[0].clone();
    changed.wireguard_devices[0].peers.update(b_key, |p| p.allowed_ips.push("10.42.20.0/24".into()));
    let report = exs[0].apply(&changed).expect("apply");
    let wg_actions: Vec<&String> = report.actions.iter().filter(|a| a.starts_with("wg set")).collect();
    assert_eq!(wg_actions.len(), 1, "{report}");
    assert!(wg_actions[0].contains(b_key.as_str()) && wg_actions[0].contains("10.42.20.0/24"), "{report}");
    let after = a.dump();
    assert_eq!(after.peer_set(), expected_peers(&changed));
    assert_eq!(after.handshake(c_key), hs, "c's session untouched");
    assert!(after.rx(c_key) >= rx, "c's counters untouched");
    assert!(reach(a, &nodes[2]), "c still answers");

    // b leaves a's state: only b goes.
    let mut without_b = changed.clone();
    without_b.wireguard_devices[0].peers.retain(|p| &p.public_key != b_key);
    let report = exs[0].apply(&without_b).expect("apply");
    assert!(report.actions.iter().any(|a| a.ends_with(&format!("peer {b_key} remove"))), "{report}");
    let after = a.dump();
    assert_eq!(after.peer_set(), expected_peers(&without_b));
    assert_eq!(after.handshake(c_key), hs, "c's session untouched by b's removal");

    // The ablation: the same peers set device-wide (`wg setconf`: every peer replaced, on
    // either backend) resets c's session, which is why kuport never does it.
    let p = without_b.wireguard_devices[0].peers.iter().next().expect("a peer");
    let conf = a.dir.join("setconf.conf");
    std::fs::create_dir_all(&a.dir).expect("state dir");
    std::fs::write(
        &conf,
        format!(
            "[Interface]\nListenPort = {PORT}\n\n[Peer]\nPublicKey = {}\nEndpoint = {}\nPersistentKeepalive = 25\nAllowedIPs = {}\n",
            p.public_key,
            p.endpoint,
            p.allowed_ips.join(", ")
        ),
    )
    .expect("config");
    let out = a.ns.exec(&["wg", "setconf", &a.dev, &conf.to_string_lossy()]);
    assert!(out.status.success(), "wg setconf: {}", String::from_utf8_lossy(&out.stderr));
    let replaced = a.dump();
    assert_eq!(replaced.peer_set(), expected_peers(&without_b), "the same configuration");
    // c's entry was made anew: its counters start again and its session is a new one (the new
    // entry's keepalive starts a handshake at once).
    let rx_before = after.rx(c_key);
    assert!(
        replaced.handshake(c_key) != hs && replaced.rx(c_key) < rx_before,
        "a device-wide replace resets c's session: {:?} (before: handshake {hs}, rx {rx_before})",
        replaced.peer(c_key)
    );
}

/// A reset (`wireguard::reset`, docs/overlay/reach.md, "The reset") makes one peer anew in one
/// request, removed then added with the same key: its counters start again, its configuration
/// is the same, the other peer keeps its session, and traffic to it resumes.
#[test]
fn a_reset_makes_one_peer_anew_and_leaves_the_other_alone() {
    if !root() {
        return;
    }
    let nodes = mesh(3);
    let (_exs, states) = bring_up(&nodes);
    let keys = keys(&nodes);
    let (a, b_key, c_key) = (&nodes[0], &keys[1], &keys[2]);
    let before = a.dump();
    let (b_rx, c_hs, c_rx) = (before.rx(b_key), before.handshake(c_key), before.rx(c_key));
    assert!(b_rx > 0 && c_hs > 0, "sessions with b and c");
    let p = states[0].wireguard_devices[0].peers.iter().find(|p| &p.public_key == b_key).expect("b");
    let spec = wireguard::PeerSpec {
        public_key: p.public_key.parse().expect("key"),
        endpoint: p.endpoint.parse().ok(),
        allowed_ips: p.allowed_ips.iter().map(|n| n.parse().expect("net")).collect(),
        keepalive: p.persistent_keepalive_seconds as u16,
    };
    assert!(wireguard::reset(&a.wireguard(), Some(&a.ns.path()), &a.dev, &spec).expect("reset"));
    let after = a.dump();
    assert_eq!(after.peer_set(), expected_peers(&states[0]), "the same configuration");
    assert!(after.rx(b_key) < b_rx, "b's counters start again: {:?} (rx before {b_rx})", after.peer(b_key));
    assert_eq!(after.handshake(c_key), c_hs, "c's session untouched");
    assert!(after.rx(c_key) >= c_rx, "c's counters untouched");
    wait_until("traffic to b again", Duration::from_secs(10), || reach(a, &nodes[1]));
}

#[test]
fn a_peer_removed_by_hand_and_a_killed_daemon_are_repaired() {
    if !root() {
        return;
    }
    let nodes = mesh(2);
    let (exs, states) = bring_up(&nodes);
    drop(exs);
    let keys = keys(&nodes);
    let a = &nodes[0];
    let wg = a.wireguard();
    let keeper = Keeper::start(Executor::new(Some(a.ns.path())).with_wireguard(Arc::clone(&wg)), states[0].clone());
    wait_until("the keeper applied", Duration::from_secs(5), || keeper.stats.get().applies > 0);
    // What the daemon does on its own (its link coming up, its IPv6 link-local address) is no
    // drift: over more than one poll, nothing is repaired.
    std::thread::sleep(WIREGUARD_POLL + Duration::from_secs(1));
    assert_eq!(keeper.stats.get().drift_repairs, 0, "{:?}", keeper.stats.get());

    // `wg set DEV peer B remove`: WireGuard announces nothing; the poll finds it.
    let out = a.ns.exec(&["wg", "set", &a.dev, "peer", &keys[1], "remove"]);
    assert!(out.status.success());
    assert!(a.dump().peer(&keys[1]).is_none());
    wait_until("the removed peer comes back", WIREGUARD_POLL + Duration::from_secs(5), || {
        a.dump().peer(&keys[1]).is_some()
    });
    assert_eq!(a.dump().peer_set(), expected_peers(&states[0]));
    assert!(
        keeper.stats.get().last_differences.iter().any(|d| d.contains("missing wireguard") && d.contains(&keys[1])),
        "{:?}",
        keeper.stats.get()
    );

    // The MTU changed by hand: rtnetlink tells, the repair sets it back.
    a.ns.ip(&["link", "set", &a.dev, "mtu", "1500"]);
    wait_until("the MTU comes back", Duration::from_secs(5), || {
        a.ns.ip(&["-o", "link", "show", &a.dev]).contains(&format!("mtu {MTU} "))
    });

    if backend(a) == BackendKind::Kernel {
        println!("skipped on the kernel backend: a killed wireguard-go daemon (there is none)");
        drop(keeper);
        return;
    }
    // The daemon dies: its link goes, the keep loop hears it and starts it again, whole.
    let pids = a.ns.pids();
    assert_eq!(pids.len(), 1, "one wireguard-go in the namespace: {pids:?}");
    run("kill", &["-9", &pids[0]]);
    wait_until("a new daemon", Duration::from_secs(10), || {
        let now = a.ns.pids();
        now.len() == 1
            && now != pids
            && a.ns.exec(&["wg", "show", &a.dev, "dump"]).status.success()
            && a.dump().peer_set() == expected_peers(&states[0])
    });
    assert_eq!(a.dump().device[1], keys[0], "the same key");
    wait_until("traffic again", Duration::from_secs(10), || reach(a, &nodes[1]));
    drop(keeper);
}

#[test]
fn the_key_survives_a_restart_and_a_lost_key_file_makes_a_new_one() {
    if !root() {
        return;
    }
    let nodes = mesh(2);
    let (exs, states) = bring_up(&nodes);
    drop(exs);
    let a = &nodes[0];
    let first = a.wireguard().public_key().to_string();
    let key_file = a.dir.join(wireguard::key::KEY_FILE);
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&key_file).expect("key file").permissions().mode() & 0o777, 0o600);

    // A restarted executor (same state directory): the same key, nothing to write.
    let mut restarted = a.executor();
    assert_eq!(a.wireguard().public_key().to_string(), first);
    assert_eq!(apply(&mut restarted, &states[0]), 0, "no peer reconfigured");
    assert_eq!(a.dump().device[1], first);

    // The key file is lost: a new key, set on the device alone (its peers stay).
    std::fs::remove_file(&key_file).expect("rm");
    let wg = a.wireguard();
    let second = wg.public_key().to_string();
    assert_ne!(second, first);
    let mut renewed = Executor::new(Some(a.ns.path())).with_wireguard(wg);
    let report = renewed.apply(&states[0]).expect("apply");
    assert_eq!(report.actions, vec![format!("wg set {} private-key <node key>", a.dev)], "{report}");
    let d = a.dump();
    assert_eq!(d.device[1], second);
    assert_eq!(d.peer_set(), expected_peers(&states[0]));
}

/// A peer with more allowed IPs than one message holds: the kernel backend cuts its set into
/// messages (the first replaces the list, the next append) and the kernel's dump splits the peer
/// across messages, joined up when read. All of them are set, all read back, nothing is left to
/// write.
#[test]
fn a_peer_with_a_thousand_allowed_ips_is_set_and_read_back_whole() {
    if !root() {
        return;
    }
    let nodes = mesh(2);
    let keys = keys(&nodes);
    let a = &nodes[0];
    let mut s = state(a, &nodes, &keys);
    let many = (0..1000u32).map(|i| format!("10.{}.{}.0/24", 100 + i / 256, i % 256));
    let first = s.wireguard_devices[0].peers.iter().next().map(|p| p.public_key.clone()).expect("a peer");
    s.wireguard_devices[0].peers.update(&first, |p| p.allowed_ips.extend(many));
    let mut whole = kuport_proto::v1::NodeState { node: String::new(), netns: vec![s] };
    kuport_proto::canonicalize(&mut whole);
    let s = whole.netns.remove(0);
    assert!(apply(&mut a.executor(), &s) > 0);
    println!("backend: {}", backend(a));
    let dump = a.dump();
    assert_eq!(dump.peers[0][3].split(',').count(), 1002);
    assert_eq!(dump.peer_set(), expected_peers(&s));
    let read = wireguard::show(&a.wireguard(), Some(&a.ns.path()), &a.dev).expect("read").expect("a device");
    assert_eq!(read.peers.len(), 1);
    assert_eq!(read.peers[0].allowed_ips.len(), 1002);
    assert_eq!(apply(&mut a.executor(), &s), 0, "read back whole: nothing to write");
}

#[test]
fn devices_are_refused_without_a_key_or_outside_kuports_names() {
    if !root() {
        return;
    }
    let nodes = mesh(2);
    let keys = keys(&nodes);
    let s = state(&nodes[0], &nodes, &keys);
    // No key given and none installed in this process.
    let mut keyless = Executor::new(Some(nodes[0].ns.path()));
    let e = keyless.apply(&s).expect_err("refused").to_string();
    assert!(e.contains("holds no WireGuard key"), "{e}");
    let mut foreign = s.clone();
    foreign.wireguard_devices[0].name = "wg0".into();
    foreign.addresses.clear();
    foreign.routes.clear();
    let e = nodes[0].executor().apply(&foreign).expect_err("refused").to_string();
    assert!(e.contains("wireguard device wg0") && e.contains("kup-"), "{e}");
    let mut bad_endpoint = s.clone();
    let first = s.wireguard_devices[0].peers.iter().next().map(|p| p.public_key.clone()).expect("a peer");
    bad_endpoint.wireguard_devices[0].peers.update(&first, |p| p.endpoint = "node-2:51820".into());
    let e = nodes[0].executor().apply(&bad_endpoint).expect_err("refused").to_string();
    assert!(e.contains("is not IP:port") && e.contains(&keys[1]), "{e}");
    // Nothing was made.
    assert!(!nodes[0].ns.ip(&["-o", "link", "show"]).contains(&nodes[0].dev));
}

/// Where the kernel has WireGuard (the VM), Auto picks it; where it has none (this host), the
/// kernel backend answers `Unsupported` when it creates a device and "no such device" when it
/// reads one, and Auto makes a `tun` run by wireguard-go. Either way the new device reads back
/// empty and deleting it leaves nothing.
#[test]
fn auto_picks_the_kernel_backend_when_the_kernel_has_wireguard_and_wireguard_go_otherwise() {
    if !root() {
        return;
    }
    let nodes = mesh(1);
    let n = &nodes[0];
    let wg = n.wireguard();
    let path = n.ns.path();
    let kernel = wg.backend(BackendKind::Kernel);
    let made = kuport_node_exec::sys::netns::run(Some(&path), || kernel.create(Some(&path), &n.dev));
    let want = match made {
        Ok(()) => {
            n.ns.ip(&["link", "del", &n.dev]);
            BackendKind::Kernel
        }
        Err(e) => {
            assert!(matches!(e, wireguard::Error::Unsupported { .. }), "{e}");
            let read = kuport_node_exec::sys::netns::run(Some(&path), || kernel.read(&n.dev)).expect("read");
            assert_eq!(read, None, "without the family, no such device");
            BackendKind::Userspace
        }
    };
    println!("this kernel has WireGuard: {}", want == BackendKind::Kernel);
    let kind = kuport_node_exec::sys::netns::run(Some(&path), || wg.create(Some(&path), &n.dev)).expect("created");
    assert_eq!(kind, want);
    assert_eq!(backend(n), want);
    let shown = wireguard::show(&wg, Some(&path), &n.dev).expect("show").expect("a device");
    assert!(shown.peers.is_empty() && shown.public_key.is_none(), "a new device has no key yet");
    kuport_node_exec::sys::netns::run(Some(&path), || wg.backend(kind).delete(&n.dev)).expect("deleted");
    assert!(!n.ns.ip(&["-o", "link", "show"]).contains(&n.dev));
    assert!(wg.userspace_pids().is_empty(), "the daemon ended with its link");
    assert!(!Path::new(&format!("/var/run/wireguard/{}.sock", n.dev)).exists());
}
