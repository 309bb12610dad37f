//! The executor reports its WireGuard peers over NodeSync (docs/overlay/status.md): a real
//! executor (the sync client with its keepers) applies a state with a WireGuard device into a
//! scratch namespace, on wireguard-go (this kernel has no WireGuard module), whose one peer is
//! a device set up by hand with `wg` in a second namespace across a veth pair. A scripted
//! controller receives a PeerReport naming the peer and the endpoint WireGuard holds, and once
//! the two have shaken hands, a later report with the handshake and bytes both ways. A counter
//! read it asks over the stream names the device as a link (as `ip` shows it) and the peer.
//! Without root it fails, unless KUPORT_SKIP_ROOT_TESTS=1.

#[path = "common/fake.rs"]
#[allow(dead_code)]
mod fake;
#[path = "common/host.rs"]
mod host;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime};

use host::{root, run};
use kuport_node_exec::sync::{self, NodeKeepers};
use kuport_proto::v1::{
    ControllerMessage, CounterReport, DesiredState, ExecutorMessage, NetnsState, NodeState, PeerReport, ReadCounters,
    controller_message, executor_message,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// A scratch namespace; on drop its processes (the wireguard-go daemon, by pid) end and it goes.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        host::remove_netns(&self.0);
    }
}

/// Two scratch namespaces, loopback up, joined by a veth pair: `a_if` in the first with
/// `a_cidr`, `b_if` in the second with `b_cidr`, both up.
fn two_namespaces(names: [String; 2], (a_if, a_cidr): (&str, &str), (b_if, b_cidr): (&str, &str)) -> [Netns; 2] {
    let [a, b] = names.map(Netns);
    for n in [&a, &b] {
        run("ip", &["netns", "add", &n.0]);
        run("ip", &["-n", &n.0, "link", "set", "lo", "up"]);
    }
    run("ip", &["-n", &a.0, "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", &b.0]);
    run("ip", &["-n", &a.0, "addr", "add", a_cidr, "dev", a_if]);
    run("ip", &["-n", &a.0, "link", "set", a_if, "up"]);
    run("ip", &["-n", &b.0, "addr", "add", b_cidr, "dev", b_if]);
    run("ip", &["-n", &b.0, "link", "set", b_if, "up"]);
    [a, b]
}

/// A fresh state directory for the executor.
fn state_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("state dir");
    dir
}

/// `wg pubkey` of a private key.
fn public_key(private: &str) -> String {
    use std::io::Write as _;
    let mut child = Command::new("wg")
        .arg("pubkey")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("wg pubkey");
    child.stdin.take().expect("stdin").write_all(private.as_bytes()).expect("write");
    String::from_utf8(child.wait_with_output().expect("wg pubkey").stdout).expect("utf-8").trim().to_string()
}

/// The real sync client with its keepers, as node `node` in the namespace at `path`, against
/// the scripted controller at `address`; it stops when the sender is used or dropped.
fn start_executor(address: &str, node: &str, path: PathBuf, dir: PathBuf) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let mut cfg = sync::Config::new(format!("http://{address}"), node);
    cfg.netns = Some(path.clone());
    cfg.state_dir = Some(dir);
    let (stop, stopped) = oneshot::channel::<()>();
    let executor = tokio::spawn(async move {
        let _ = sync::run(cfg, NodeKeepers::new(Some(path)), async {
            let _ = stopped.await;
        })
        .await;
    });
    (stop, executor)
}

/// The next PeerReport the scripted controller receives before `deadline` (every Ack on the
/// way must say the state applied).
async fn next_report(
    seen: &mut mpsc::UnboundedReceiver<ExecutorMessage>,
    deadline: tokio::time::Instant,
) -> PeerReport {
    loop {
        match tokio::time::timeout_at(deadline, seen.recv()).await {
            Ok(Some(ExecutorMessage { message: Some(executor_message::Message::Peers(r)) })) => break r,
            Ok(Some(ExecutorMessage { message: Some(executor_message::Message::Ack(a)) })) => {
                assert!(a.ok, "the state applies: {:?}", a.errors);
            }
            Ok(Some(_)) => {}
            other => panic!("no peer report: {other:?}"),
        }
    }
}

/// The first PeerReport and the answer to ReadCounters `id` the scripted controller receives
/// before `deadline`, in whichever order they come.
async fn report_and_counters(
    seen: &mut mpsc::UnboundedReceiver<ExecutorMessage>,
    deadline: tokio::time::Instant,
    id: u64,
) -> (PeerReport, CounterReport) {
    let (mut peers, mut counters): (Option<PeerReport>, Option<CounterReport>) = (None, None);
    loop {
        if let (Some(p), Some(c)) = (&peers, &counters) {
            return (p.clone(), c.clone());
        }
        match tokio::time::timeout_at(deadline, seen.recv()).await {
            Ok(Some(ExecutorMessage { message: Some(executor_message::Message::Peers(r)) })) => {
                peers.get_or_insert(r);
            }
            Ok(Some(ExecutorMessage { message: Some(executor_message::Message::Counters(c)) })) => {
                assert_eq!(c.id, id, "the answer to the read asked");
                counters = Some(c);
            }
            Ok(Some(ExecutorMessage { message: Some(executor_message::Message::Ack(a)) })) => {
                assert!(a.ok, "the state applies: {:?}", a.errors);
            }
            Ok(Some(_)) => {}
            other => panic!("no peer report and counters: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_executor_reports_its_peers_after_applying_a_device() {
    if !root() {
        return;
    }
    let pid = std::process::id();
    let [ns, other] = two_namespaces(
        [format!("kuport-peers-{pid}"), format!("kuport-peers-b-{pid}")],
        ("u0", "192.0.2.1/24"),
        ("u1", "192.0.2.2/24"),
    );
    let path = PathBuf::from(format!("/var/run/netns/{}", ns.0));
    let dir = state_dir(&format!("kuport-peers-root-{pid}"));
    // Unique: wireguard-go's UAPI sockets share one folder across namespaces.
    let (dev, dev_b) = (format!("kup-p{}", pid % 1_000_000), format!("kup-q{}", pid % 1_000_000));

    // The peer, by hand: wireguard-go and `wg` in the other namespace, no endpoint of its own
    // (it learns ours from our packets).
    let key_b = run("wg", &["genkey"]);
    let key_file = dir.join("b.key");
    std::fs::write(&key_file, &key_b).expect("key");
    let public_b = public_key(&key_b);
    run("ip", &["netns", "exec", &other.0, "wireguard-go", &dev_b]);
    let key_path = key_file.display().to_string();
    let wg_b = |args: &[&str]| {
        let mut all = vec!["netns", "exec", other.0.as_str(), "wg"];
        all.extend_from_slice(args);
        run("ip", &all)
    };
    wg_b(&["set", &dev_b, "private-key", &key_path, "listen-port", "51821"]);
    run("ip", &["-n", &other.0, "link", "set", &dev_b, "up"]);

    let peer = kuport_proto::build::wireguard_peer(&public_b, "192.0.2.2:51821".parse().ok(), &["10.42.9.0/24"], 25);
    let device = kuport_proto::build::wireguard_device(&dev, 1380, 51820, vec![peer]);
    let state = NodeState {
        node: "n".into(),
        netns: vec![NetnsState { wireguard_devices: vec![device], ..Default::default() }],
    };
    let version = kuport_proto::canonical_version(&state);
    let ds = DesiredState { term: 1, sequence: 1, version, state: Some(state) };
    // The state, then a counter read as the controller asks for one (docs/operations/counters.md).
    let read = ReadCounters { id: 7 };
    let script = vec![
        ControllerMessage { message: Some(controller_message::Message::State(ds)) },
        ControllerMessage { message: Some(controller_message::Message::ReadCounters(read)) },
    ];
    let (address, mut seen) = fake::start(script).await;
    let (stop, executor) = start_executor(&address, "n", path, dir.clone());

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (first, counters) = report_and_counters(&mut seen, deadline, 7).await;
    println!("first: {first:?}\ncounters: {counters:?}");
    // The counter read names the device as a link, as ip shows it, and the peer as WireGuard
    // holds it.
    assert_eq!(counters.error, "", "{counters:?}");
    assert_eq!(counters.links.len(), 1, "{counters:?}");
    let link = &counters.links[0];
    let shown = run("ip", &["-n", &ns.0, "-j", "link", "show", &dev]);
    let shown: serde_json::Value = serde_json::from_str(&shown).expect("ip's JSON");
    let up = shown[0]["flags"].as_array().is_some_and(|f| f.iter().any(|f| f == "UP"));
    assert_eq!((link.name.as_str(), link.mtu, link.up), (dev.as_str(), 1380, up), "{shown}");
    assert_eq!(shown[0]["mtu"].as_u64(), Some(1380), "{shown}");
    let keys: Vec<(&str, &str)> = counters.peers.iter().map(|p| (p.public_key.as_str(), p.endpoint.as_str())).collect();
    assert_eq!(keys, [(public_b.as_str(), "192.0.2.2:51821")]);
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("clock").as_secs();
    assert!(counters.read_unix_seconds.abs_diff(now) < 60, "read at {}", counters.read_unix_seconds);
    assert_eq!(first.peers.len(), 1, "{first:?}");
    let p = &first.peers[0];
    assert_eq!((p.public_key.as_str(), p.endpoint.as_str()), (public_b.as_str(), "192.0.2.2:51821"));
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("clock").as_secs();
    assert!(first.read_unix_seconds.abs_diff(now) < 60, "read at {}", first.read_unix_seconds);

    // Now the other end knows us: the keepalive's handshake completes, and a later poll (every
    // 10 s) reports it, with bytes both ways.
    let public_a = run("ip", &["netns", "exec", &ns.0, "wg", "show", &dev, "public-key"]).trim().to_string();
    wg_b(&["set", &dev_b, "peer", &public_a, "allowed-ips", "10.42.8.0/24"]);
    let live = loop {
        let r = next_report(&mut seen, deadline).await;
        println!("later: {r:?}");
        if r.peers.first().is_some_and(|p| p.last_handshake_unix_seconds != 0) {
            break r;
        }
    };
    let p = &live.peers[0];
    assert!(p.last_handshake_unix_seconds.abs_diff(live.read_unix_seconds) < 60, "{p:?}");
    assert!(p.receive_bytes > 0 && p.transmit_bytes > 0, "{p:?}");

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), executor).await;
    // The daemon outlives the executor (docs/overlay/node.md): deleting the link ends it.
    let _ = Command::new("ip").args(["-n", &ns.0, "link", "del", &dev]).status();
    let _ = Command::new("ip").args(["-n", &other.0, "link", "del", &dev_b]).status();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The controller's relay table (docs/overlay/relays.md) with its interface named `dev`, for
/// the pod CIDRs the test sends between, 10.42.1.0/24 and 10.42.2.0/24.
fn relay_table_on(dev: &str) -> kuport_proto::v1::NftTable {
    let cidrs: Vec<ipnet::IpNet> = ["10.42.1.0/24", "10.42.2.0/24"].map(|c| c.parse().expect("a CIDR")).to_vec();
    kuport_controller::compute::overlay::relay_filter_table(dev, &cidrs)
}

/// Relayed bytes (docs/overlay/reach.md): the executor reports the byte counter of the relay's
/// accept rule in its `inet kuport-overlay` table, read back over netlink with kuport's codec.
/// The relay namespace gets the table (the forward chain with the relay's accepts, as in
/// tests/data/overlay_relay.nft) from the real sync client and keepers, and a WireGuard device
/// with one peer (a report goes only from a node with peers). The packets that cross the rule
/// are not WireGuard's: the interface the rule names is a veth (`rl0`, outside kuport's link
/// prefix so that the executor leaves its addresses alone), and a sender namespace behind it
/// sends UDP from a pod address to another pod address through the relay, which routes it out
/// of the same interface, as a relay does between two peers. So this proves the counter is read
/// from the rule and reported as it rises, not WireGuard's side of relaying (the lab's relay
/// scenario does that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_rules_bytes_are_reported_as_they_rise() {
    if !root() {
        return;
    }
    let pid = std::process::id();
    let [relay, sender] = two_namespaces(
        [format!("kuport-relayed-{pid}"), format!("kuport-relayed-s-{pid}")],
        ("rl0", "10.42.0.1/24"),
        ("s0", "10.42.1.5/24"),
    );
    let (r, s) = (relay.0.as_str(), sender.0.as_str());
    let mac = run("ip", &["netns", "exec", s, "cat", "/sys/class/net/s0/address"]).trim().to_string();
    // The relay routes both pod CIDRs out of rl0; 10.42.2.7 answers ARP nowhere, so its
    // neighbour is the sender's MAC (which drops it: not its address, no forwarding).
    run("ip", &["-n", r, "route", "add", "10.42.1.0/24", "dev", "rl0"]);
    run("ip", &["-n", r, "route", "add", "10.42.2.0/24", "dev", "rl0"]);
    run("ip", &["-n", r, "neigh", "add", "10.42.2.7", "lladdr", &mac, "dev", "rl0"]);
    run("ip", &["netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    run("ip", &["-n", s, "route", "add", "10.42.0.1", "dev", "s0"]);
    run("ip", &["-n", s, "route", "add", "10.42.2.0/24", "via", "10.42.0.1", "dev", "s0"]);

    let path = PathBuf::from(format!("/var/run/netns/{r}"));
    let dir = state_dir(&format!("kuport-relayed-root-{pid}"));
    let dev = format!("kup-r{}", pid % 1_000_000);
    let peer_key = run("wg", &["genkey"]);
    let peer_public = public_key(&peer_key);
    let peer = kuport_proto::build::wireguard_peer(&peer_public, None, &["10.42.9.0/24"], 0);
    let device = kuport_proto::build::wireguard_device(&dev, 1420, 51820, vec![peer]);
    let state = NodeState {
        node: "relay".into(),
        netns: vec![NetnsState {
            wireguard_devices: vec![device],
            nft_tables: vec![relay_table_on("rl0")].into(),
            ..Default::default()
        }],
    };
    // As the controller sends it: the sets' digests and runs filled in.
    let mut state = state;
    kuport_proto::canonicalize(&mut state);
    let version = kuport_proto::canonical_version(&state);
    let ds = DesiredState { term: 1, sequence: 1, version, state: Some(state) };
    let (address, mut seen) =
        fake::start(vec![ControllerMessage { message: Some(controller_message::Message::State(ds)) }]).await;
    let (stop, executor) = start_executor(&address, "relay", path, dir.clone());

    let within = || tokio::time::Instant::now() + Duration::from_secs(30);
    let first = next_report(&mut seen, within()).await;
    println!("first: relayed {} bytes", first.relayed_bytes);
    assert_eq!(first.relayed_bytes, 0, "nothing relayed yet: {first:?}");

    // 10 datagrams of 100 bytes of payload, from a pod address to another, through the relay.
    let payload = "x".repeat(100);
    for _ in 0..10 {
        let send = format!("echo -n {payload} > /dev/udp/10.42.2.7/9");
        run("ip", &["netns", "exec", s, "bash", "-c", &send]);
    }
    let oracle = run("ip", &["netns", "exec", r, "nft", "list", "table", "inet", "kuport-overlay"]);
    println!("{oracle}");
    // The next reports (the peers' poll, every 10 s): 10 packets of 128 bytes (IP and UDP
    // headers with the payload) crossed the relay's accept.
    let later = loop {
        let r = next_report(&mut seen, within()).await;
        println!("later: relayed {} bytes", r.relayed_bytes);
        if r.relayed_bytes > 0 {
            break r;
        }
    };
    assert_eq!(later.relayed_bytes, 10 * 128, "{oracle}");
    assert!(oracle.contains("packets 10 bytes 1280 accept"), "nft's own counter agrees: {oracle}");

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), executor).await;
    let _ = Command::new("ip").args(["-n", r, "link", "del", &dev]).status();
    let _ = std::fs::remove_dir_all(&dir);
}
