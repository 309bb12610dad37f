//! The executor reports its WireGuard peers over NodeSync (docs/overlay/status.md): a real
//! executor (the sync client with its keepers) applies a state with a WireGuard device into a
//! scratch namespace, on wireguard-go (this kernel has no WireGuard module), whose one peer is
//! a device set up by hand with `wg` in a second namespace across a veth pair. A scripted
//! controller receives a PeerReport naming the peer and the endpoint WireGuard holds, and once
//! the two have shaken hands, a later report with the handshake and bytes both ways. Without
//! root it fails, unless KUPORT_SKIP_ROOT_TESTS=1.

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
    ControllerMessage, DesiredState, ExecutorMessage, NetnsState, NodeState, controller_message, executor_message,
};

/// A scratch namespace; on drop its processes (the wireguard-go daemon, by pid) end and it goes.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        host::remove_netns(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_executor_reports_its_peers_after_applying_a_device() {
    if !root() {
        return;
    }
    let pid = std::process::id();
    let ns = Netns(format!("kuport-peers-{pid}"));
    let other = Netns(format!("kuport-peers-b-{pid}"));
    for n in [&ns, &other] {
        run("ip", &["netns", "add", &n.0]);
        run("ip", &["-n", &n.0, "link", "set", "lo", "up"]);
    }
    run("ip", &["-n", &ns.0, "link", "add", "u0", "type", "veth", "peer", "name", "u1", "netns", &other.0]);
    run("ip", &["-n", &ns.0, "addr", "add", "192.0.2.1/24", "dev", "u0"]);
    run("ip", &["-n", &ns.0, "link", "set", "u0", "up"]);
    run("ip", &["-n", &other.0, "addr", "add", "192.0.2.2/24", "dev", "u1"]);
    run("ip", &["-n", &other.0, "link", "set", "u1", "up"]);
    let path = PathBuf::from(format!("/var/run/netns/{}", ns.0));
    let dir = std::env::temp_dir().join(format!("kuport-peers-root-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("state dir");
    // Unique: wireguard-go's UAPI sockets share one folder across namespaces.
    let (dev, dev_b) = (format!("kup-p{}", pid % 1_000_000), format!("kup-q{}", pid % 1_000_000));

    // The peer, by hand: wireguard-go and `wg` in the other namespace, no endpoint of its own
    // (it learns ours from our packets).
    let key_b = run("wg", &["genkey"]);
    let key_file = dir.join("b.key");
    std::fs::write(&key_file, &key_b).expect("key");
    let public_b = {
        use std::io::Write as _;
        let mut child = Command::new("wg")
            .arg("pubkey")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("wg pubkey");
        child.stdin.take().expect("stdin").write_all(key_b.as_bytes()).expect("write");
        String::from_utf8(child.wait_with_output().expect("wg pubkey").stdout).expect("utf-8").trim().to_string()
    };
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
    let script = vec![ControllerMessage { message: Some(controller_message::Message::State(ds)) }];
    let (address, mut seen) = fake::start(script).await;

    let mut cfg = sync::Config::new(format!("http://{address}"), "n");
    cfg.netns = Some(path.clone());
    cfg.state_dir = Some(dir.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let executor = tokio::spawn(sync::run(cfg, NodeKeepers::new(Some(path)), async {
        let _ = stopped.await;
    }));

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut next_report = async || loop {
        match tokio::time::timeout_at(deadline, seen.recv()).await {
            Ok(Some(ExecutorMessage { message: Some(executor_message::Message::Peers(r)) })) => break r,
            Ok(Some(ExecutorMessage { message: Some(executor_message::Message::Ack(a)) })) => {
                assert!(a.ok, "the state applies: {:?}", a.errors);
            }
            Ok(Some(_)) => {}
            other => panic!("no peer report: {other:?}"),
        }
    };
    let first = next_report().await;
    println!("first: {first:?}");
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
        let r = next_report().await;
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
