//! Relayed pairs over the real NodeSync service and /metrics, with fake executors
//! (docs/overlay/relays.md, docs/overlay/status.md): a reach report that relays a pair shows in
//! `kuport_overlay_peer_relayed{via}` and `kuport_overlay_peer_direct` 0 on both sides, and a
//! relay's relayed bytes in `kuport_overlay_relayed_bytes_total`; back to direct, the relayed
//! series go. A new leader's first state to an executor that applied a state before waits for
//! its report after Hello, so it goes out with the pair relayed; one that sends no report gets
//! its state after the short hold.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kuport_controller::compute::Settings;
use kuport_controller::compute::overlay::relays::CONTROL_PLANE_LABEL;
use kuport_controller::compute::overlay::{OverlaySettings, PUBLIC_KEY_ANNOTATION};
use kuport_controller::observe::Cluster;
use kuport_controller::stream::{Hub, leader};
use kuport_proto::v1::{
    Applied, ExecutorMessage, Hello, PeerReport, PeerStatus, Reach, controller_message, executor_message,
};
use tokio::sync::mpsc;

mod common;
use common::executor::{metrics, wireguard_peers};

const CLOUD: &str = "kOzLDlGv6e2AmDVfmJC7dRGCU8vMC9RcrxDBB4Y+uiM=";
const HOME_A: &str = "l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfiU=";
const HOME_B: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

fn node(name: &str, ip: &str, pod_cidr: &str, relay: bool) -> Node {
    let labels = relay.then(|| [(CONTROL_PLANE_LABEL.to_string(), String::new())].into());
    Node {
        metadata: ObjectMeta { name: Some(name.into()), labels, ..Default::default() },
        spec: Some(NodeSpec { pod_cidrs: Some(vec![pod_cidr.into()]), ..Default::default() }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: ip.into() }]),
            ..Default::default()
        }),
    }
}

/// The scenario: a cloud node labelled control-plane, two homes on the same LAN prefix;
/// `published`: each Node carries the key annotation a previous leader wrote.
fn homes(published: bool) -> Cluster {
    let mut nodes = vec![
        node("cloud", "203.0.113.10", "10.42.0.0/24", true),
        node("home-a", "10.99.0.2", "10.42.1.0/24", false),
        node("home-b", "10.99.0.2", "10.42.2.0/24", false),
    ];
    for (n, key) in nodes.iter_mut().zip([CLOUD, HOME_A, HOME_B]).filter(|_| published) {
        n.metadata.annotations = Some([(PUBLIC_KEY_ANNOTATION.to_string(), key.to_string())].into());
    }
    Cluster { nodes: nodes.into(), now: k8s_openapi::jiff::Timestamp::now(), ..Default::default() }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("clock").as_secs()
}

/// Per node, every state its fake executor received, in order: per peer key, its allowed IPs.
type States = Arc<Mutex<BTreeMap<String, Vec<BTreeMap<String, Vec<String>>>>>>;

fn peers_report(peers: &[(&str, Reach)], relayed_bytes: u64) -> ExecutorMessage {
    let peers = peers
        .iter()
        .map(|(key, reach)| PeerStatus {
            public_key: (*key).into(),
            last_handshake_unix_seconds: unix_now() - 5,
            reach: *reach as i32,
            ..Default::default()
        })
        .collect();
    let r = PeerReport { peers, read_unix_seconds: unix_now(), relayed_bytes };
    ExecutorMessage { message: Some(executor_message::Message::Peers(r)) }
}

/// A fake executor: says Hello (with `applied` when it holds a state from before), reports
/// `key` and then `first` at once (as an executor with WireGuard peers does right after
/// Hello), and records every state that comes down.
struct Fake {
    tx: mpsc::Sender<ExecutorMessage>,
    _task: tokio::task::JoinHandle<()>,
}

impl Fake {
    async fn connect(
        address: &str,
        node: &str,
        key: &str,
        applied: Option<Applied>,
        first: Option<ExecutorMessage>,
        states: States,
    ) -> Fake {
        let hello = Hello { node: node.into(), executor_version: "test".into(), applied };
        let (tx, mut inbound) = common::executor::connect(address, hello, key, first).await;
        let name = node.to_string();
        let task = tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                let Some(controller_message::Message::State(ds)) = m.message else { continue };
                let peers: BTreeMap<String, Vec<String>> =
                    wireguard_peers(&ds).map(|p| (p.public_key.clone(), p.allowed_ips.clone())).collect();
                states.lock().expect("states").entry(name.clone()).or_default().push(peers);
            }
        });
        Fake { tx, _task: task }
    }

    async fn send(&self, m: ExecutorMessage) {
        self.tx.send(m).await.expect("send");
    }
}

/// A controller on loopback serving NodeSync and /metrics: (NodeSync address, metrics
/// address, hub, the leadership sender kept alive).
async fn controller(published: bool) -> (String, String, Arc<Hub>, tokio::sync::watch::Sender<leader::Leadership>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let (lead, rx) = leader::standalone(address.clone());
    let settings = Settings { overlay: Some(OverlaySettings::default()) };
    let hub = Hub::new(settings, rx, true);
    hub.set_inputs(homes(published));
    // A new leader computes before any executor reaches it.
    hub.recompute();
    tokio::spawn(hub.clone().recompute_loop(None));
    tokio::spawn(kuport_controller::serve::serve_grpc(
        hub.clone(),
        listener,
        Default::default(),
        std::future::pending(),
    ));
    let metrics_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let metrics_address = metrics_listener.local_addr().expect("address").to_string();
    tokio::spawn(kuport_controller::report::metrics::serve(metrics_listener, hub.clone()));
    (address, metrics_address, hub, lead)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_pair_shows_in_the_metrics_with_its_relay_and_the_relays_bytes() {
    let (address, metrics_address, _hub, _lead) = controller(false).await;
    let states: States = Arc::default();
    let cloud = Fake::connect(&address, "cloud", CLOUD, None, None, states.clone()).await;
    let home_a = Fake::connect(&address, "home-a", HOME_A, None, None, states.clone()).await;
    let _home_b = Fake::connect(&address, "home-b", HOME_B, None, None, states.clone()).await;
    let line = |m: &str, labels: &str| {
        let prefix = format!("{m}{{{labels}}} ");
        metrics(&metrics_address).lines().find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
    };
    let direct =
        |node: &str, peer: &str| line("kuport_overlay_peer_direct", &format!("node=\"{node}\",peer=\"{peer}\""));
    let relayed = |node: &str, peer: &str| {
        line("kuport_overlay_peer_relayed", &format!("node=\"{node}\",peer=\"{peer}\",via=\"cloud\""))
    };
    common::within(Duration::from_secs(10), "every pair direct", || {
        let all = [("home-a", "home-b"), ("home-b", "home-a"), ("cloud", "home-a"), ("home-a", "cloud")]
            .iter()
            .all(|(n, p)| direct(n, p).as_deref() == Some("1"));
        if all { Ok(()) } else { Err(metrics(&metrics_address)) }
    })
    .await;
    assert!(!metrics(&metrics_address).contains("kuport_overlay_peer_relayed{"), "no relayed series");

    // home-a reports home-b unreachable; cloud has relayed bytes, home-a claims some too.
    home_a.send(peers_report(&[(CLOUD, Reach::Direct), (HOME_B, Reach::Unreachable)], 5)).await;
    cloud.send(peers_report(&[(HOME_A, Reach::Direct), (HOME_B, Reach::Direct)], 4242)).await;
    common::within(Duration::from_secs(10), "the pair relayed via cloud on both sides", || {
        let sides = [("home-a", "home-b"), ("home-b", "home-a")];
        let ok =
            sides.iter().all(|(n, p)| relayed(n, p).as_deref() == Some("1") && direct(n, p).as_deref() == Some("0"));
        if ok { Ok(()) } else { Err(metrics(&metrics_address)) }
    })
    .await;
    let m = metrics(&metrics_address);
    assert_eq!(direct("home-a", "cloud").as_deref(), Some("1"), "{m}");
    assert_eq!(line("kuport_overlay_relayed_bytes_total", "node=\"cloud\"").as_deref(), Some("4242"), "{m}");
    assert!(!m.contains("kuport_overlay_relayed_bytes_total{node=\"home-a\"}"), "a home is no relay: {m}");
    println!(
        "{}",
        m.lines()
            .filter(|l| l.starts_with("kuport_overlay_peer_direct") || l.contains("relayed"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // Reachable again: direct on both sides, and no relayed series.
    home_a.send(peers_report(&[(CLOUD, Reach::Direct), (HOME_B, Reach::Direct)], 5)).await;
    common::within(Duration::from_secs(10), "the pair direct again", || {
        let m = metrics(&metrics_address);
        let ok = direct("home-a", "home-b").as_deref() == Some("1")
            && direct("home-b", "home-a").as_deref() == Some("1")
            && !m.contains("kuport_overlay_peer_relayed{");
        if ok { Ok(()) } else { Err(m) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leaders_first_state_waits_for_the_report_so_a_relayed_pair_stays_relayed() {
    // The Nodes carry the keys the old leader published: a first state waits for those
    // members' keys too, so home-a's has home-b although home-b connects later.
    let (address, _metrics, hub, _lead) = controller(true).await;
    let states: States = Arc::default();
    // Each held a state from the old leader.
    let applied = || Some(Applied { term: 1, sequence: 3, version: "old".into() });
    let report = |peers: &[(&str, Reach)]| Some(peers_report(peers, 0));
    let _home_a = Fake::connect(
        &address,
        "home-a",
        HOME_A,
        applied(),
        report(&[(CLOUD, Reach::Direct), (HOME_B, Reach::Unreachable)]),
        states.clone(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(states.lock().expect("states").get("home-a").is_none(), "home-a's first state waits for home-b's key");
    let _home_b = Fake::connect(
        &address,
        "home-b",
        HOME_B,
        applied(),
        report(&[(CLOUD, Reach::Direct), (HOME_A, Reach::Unreachable)]),
        states.clone(),
    )
    .await;
    // An executor that sends no report: its state still comes, after the hold.
    let _cloud = Fake::connect(&address, "cloud", CLOUD, applied(), None, states.clone()).await;
    let first = |n: &str| states.lock().expect("states").get(n).and_then(|s| s.first().cloned());
    common::within(Duration::from_secs(10), "every node's first state", || {
        if ["home-a", "home-b", "cloud"].iter().all(|n| first(n).is_some()) {
            Ok(())
        } else {
            Err(format!("{states:?}"))
        }
    })
    .await;
    let a = first("home-a").expect("a state");
    let b = first("home-b").expect("a state");
    assert_eq!(
        a.get(HOME_B).map(Vec::as_slice),
        Some(&["10.42.2.0/32".to_string()][..]),
        "relayed from the first state"
    );
    assert!(a.get(CLOUD).is_some_and(|c| c.contains(&"10.42.2.0/24".to_string())), "home-b's pods via cloud: {a:?}");
    assert_eq!(b.get(HOME_A).map(Vec::as_slice), Some(&["10.42.1.0/32".to_string()][..]), "{b:?}");
    // Every state home-a got kept the pair relayed: no direct moment.
    for s in states.lock().expect("states").get("home-a").into_iter().flatten() {
        assert_eq!(s.get(HOME_B).map(Vec::len), Some(1), "{s:?}");
    }
    for n in ["home-a", "home-b", "cloud"] {
        assert!(hub.served_this_term(n), "{n}");
    }
}
