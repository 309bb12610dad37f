//! The executors' peer reports over the real NodeSync service (docs/overlay/status.md), with
//! fake executors: a report's bytes and handshake ages show in /metrics per node and peer and
//! in `kuportctl mesh`; a silent peer's endpoint in the streamed state moves to its next
//! candidate after each 20 s period and cycles; an endpoint one node observes becomes a
//! candidate for the others; a live peer's endpoint stays; a report that changes only bytes
//! recomputes nothing; a node that disconnects loses its series.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kuport_controller::compute::Settings;
use kuport_controller::compute::overlay::OverlaySettings;
use kuport_controller::observe::Cluster;
use kuport_controller::stream::{Hub, leader};
use kuport_proto::v1::{ExecutorMessage, Hello, PeerReport, PeerStatus, controller_message, executor_message};
use tokio::sync::mpsc;

mod common;
use common::executor::{metrics, wireguard_peers};

const CLOUD: &str = "kOzLDlGv6e2AmDVfmJC7dRGCU8vMC9RcrxDBB4Y+uiM=";
const HOME: &str = "l3LKPRYYCDZBtZU+TDBSqPB9awxGnj7GcNpPnbcTfiU=";
const VM: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
/// A key no member has: named by its first 8 characters.
const STRANGER: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

fn node(name: &str, addresses: &[(&str, &str)], pod_cidr: &str) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { pod_cidrs: Some(vec![pod_cidr.into()]), ..Default::default() }),
        status: Some(NodeStatus {
            addresses: Some(
                addresses.iter().map(|(t, a)| NodeAddress { type_: (*t).into(), address: (*a).into() }).collect(),
            ),
            ..Default::default()
        }),
    }
}

/// The sites: a cloud node with an ExternalIP, a home worker behind NAT (its NAT's
/// public address as its ExternalIP, no port forward: its peers see its packets from another
/// port of that address), a VM with only a private address. The fake executors all connect from
/// loopback, so the home's NAT address is vouched for by its Node (docs/overlay/status.md).
fn sites() -> Cluster {
    Cluster {
        nodes: vec![
            node("cloud", &[("InternalIP", "10.0.0.5"), ("ExternalIP", "203.0.113.7")], "10.42.0.0/24"),
            node("home", &[("InternalIP", "192.168.1.10"), ("ExternalIP", "198.51.100.20")], "10.42.1.0/24"),
            node("vm", &[("InternalIP", "172.31.5.4")], "10.42.2.0/24"),
        ]
        .into(),
        now: k8s_openapi::jiff::Timestamp::now(),
        ..Default::default()
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("clock").as_secs()
}

fn ep(s: &str) -> SocketAddr {
    s.parse().expect("endpoint")
}

/// Per node, the latest state its fake executor received: per peer key, the endpoint.
type States = Arc<Mutex<BTreeMap<String, BTreeMap<String, String>>>>;

/// A fake executor: says Hello and reports `key`, records every state that comes down.
struct Fake {
    tx: mpsc::Sender<ExecutorMessage>,
    task: tokio::task::JoinHandle<()>,
}

impl Fake {
    async fn connect(address: &str, node: &str, key: &str, states: States) -> Fake {
        let hello = Hello { node: node.into(), executor_version: "test".into(), applied: None };
        let (tx, mut inbound) = common::executor::connect(address, hello, key, None).await;
        let name = node.to_string();
        let task = tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                let Some(controller_message::Message::State(ds)) = m.message else { continue };
                let peers: BTreeMap<String, String> =
                    wireguard_peers(&ds).map(|p| (p.public_key.clone(), p.endpoint.clone())).collect();
                states.lock().expect("states").insert(name.clone(), peers);
            }
        });
        Fake { tx, task }
    }

    async fn report(&self, peers: Vec<PeerStatus>) {
        let r = PeerReport { peers, read_unix_seconds: unix_now(), relayed_bytes: 0 };
        self.tx.send(ExecutorMessage { message: Some(executor_message::Message::Peers(r)) }).await.expect("send");
    }
}

/// A peer as WireGuard shows it: `handshake` seconds ago (None: never).
fn peer(key: &str, endpoint: &str, handshake: Option<u64>, rx: u64, tx: u64) -> PeerStatus {
    PeerStatus {
        public_key: key.into(),
        endpoint: endpoint.into(),
        last_handshake_unix_seconds: handshake.map_or(0, |ago| unix_now() - ago),
        receive_bytes: rx,
        transmit_bytes: tx,
        ..Default::default()
    }
}

/// The endpoint `node`'s latest state gives the peer with `key`.
fn endpoint_of(states: &States, node: &str, key: &str) -> Option<String> {
    states.lock().expect("states").get(node).and_then(|p| p.get(key).cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_reports_feed_metrics_mesh_and_the_endpoint_rotation() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let (_lead, rx) = leader::standalone(address.clone());
    let settings = Settings { overlay: Some(OverlaySettings::default()) };
    let hub = Hub::new(settings, rx, true);
    hub.set_inputs(sites());
    tokio::spawn(hub.clone().recompute_loop(None));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(kuport_controller::serve::serve_grpc(hub.clone(), listener, Default::default(), async {
        let _ = stopped.await;
    }));
    let metrics_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let metrics_address = metrics_listener.local_addr().expect("address").to_string();
    tokio::spawn(kuport_controller::report::metrics::serve(metrics_listener, hub.clone()));

    let states: States = Arc::default();
    let cloud = Fake::connect(&address, "cloud", CLOUD, states.clone()).await;
    let home = Fake::connect(&address, "home", HOME, states.clone()).await;
    let vm = Fake::connect(&address, "vm", VM, states.clone()).await;
    let meshed = |n: &str| states.lock().expect("states").get(n).is_some_and(|p| p.len() == 2);
    common::within(Duration::from_secs(10), "every member peers with the two others", || {
        if ["cloud", "home", "vm"].iter().all(|n| meshed(n)) { Ok(()) } else { Err(format!("{states:?}")) }
    })
    .await;
    let (home_announced, home_observed) = ("198.51.100.20:51820", "198.51.100.20:40001");
    assert_eq!(endpoint_of(&states, "vm", HOME).as_deref(), Some(home_announced), "no report: announced");

    // cloud has a live session with home, whose packets come from its NAT's mapping; vm was
    // never heard from; a stranger's key is named by its first 8 characters.
    cloud
        .report(vec![
            peer(HOME, home_observed, Some(10), 1234, 5678),
            peer(VM, "172.31.5.4:51820", None, 0, 148),
            peer(STRANGER, "", None, 0, 0),
        ])
        .await;
    // vm has never reached home; home's live session with cloud.
    vm.report(vec![peer(HOME, home_announced, None, 0, 296), peer(CLOUD, "203.0.113.7:51820", Some(5), 10, 20)]).await;
    home.report(vec![peer(CLOUD, "203.0.113.7:51820", Some(5), 20, 10)]).await;

    let series = |m: &str, node: &str, peer: &str| {
        let prefix = format!("{m}{{node=\"{node}\",peer=\"{peer}\"}} ");
        metrics(&metrics_address).lines().find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
    };
    common::within(Duration::from_secs(10), "cloud's report in /metrics", || {
        match series("kuport_overlay_peer_receive_bytes_total", "cloud", "home").as_deref() {
            Some("1234") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(series("kuport_overlay_peer_transmit_bytes_total", "cloud", "home").as_deref(), Some("5678"));
    let age: f64 = series("kuport_overlay_peer_last_handshake_age_seconds", "cloud", "home")
        .and_then(|v| v.parse().ok())
        .expect("an age");
    assert!((10.0..120.0).contains(&age), "{age}");
    // Never: +Inf (prometheus-client spells it "inf", which Prometheus parses as +Inf).
    let never = series("kuport_overlay_peer_last_handshake_age_seconds", "cloud", "vm").expect("a series");
    assert!(never.parse::<f64>().is_ok_and(|v| v == f64::INFINITY), "{never}");
    assert_eq!(series("kuport_overlay_peer_transmit_bytes_total", "cloud", &STRANGER[..8]).as_deref(), Some("0"));

    // kuportctl mesh shows cloud's peers with their handshakes and bytes.
    let mut debug = kuport_controller::ctl::connect(&format!("http://{address}")).await.expect("debug");
    let text = kuport_controller::ctl::mesh(&mut debug, kuport_controller::ctl::Output::Text).await.expect("mesh");
    println!("{text}");
    let row = text.lines().find(|l| l.trim_start().starts_with("home ") && l.contains(home_observed)).expect("row");
    assert!(row.contains("s ago") && row.contains("1.2 KiB") && row.contains("5.5 KiB"), "{row}");
    assert!(text.lines().any(|l| l.trim_start().starts_with("vm ") && l.contains("never")), "{text}");

    // vm's silent peer home moves between its announced endpoint and the one cloud observed,
    // once per 20 s period; cloud's live peer home keeps its endpoint all along.
    // Once every report is in and its recompute went out, only the period moves endpoints.
    common::within(Duration::from_secs(10), "every report arrives", || {
        let all = ["cloud", "home", "vm"].iter().all(|n| hub.node(n).is_some_and(|s| !s.peers.is_empty()));
        if all { Ok(()) } else { Err("reports missing".into()) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Right after a period begins the states may still hold the last period's endpoint (the
    // rotation's recompute lands a moment later): read the first one clear of that window, so
    // that it is this period's and its move comes with the next.
    while unix_now() % 20 < 3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cloud_home = endpoint_of(&states, "cloud", HOME);
    let first = endpoint_of(&states, "vm", HOME).expect("an endpoint");
    let period = || unix_now() / 20;
    let first_period = period();
    let wait = |from: String| {
        let states = states.clone();
        async move {
            let mut next = None;
            common::within(Duration::from_secs(45), "the silent peer's endpoint moves", || {
                match endpoint_of(&states, "vm", HOME) {
                    Some(e) if e != from => {
                        next = Some(e);
                        Ok(())
                    }
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
            next.expect("moved")
        }
    };
    let second = wait(first.clone()).await;
    let second_period = period();
    println!("{first} -> {second} at {}", unix_now());
    assert!(second_period > first_period, "it moved with a new period");
    let mut seen = [ep(&first), ep(&second)];
    seen.sort();
    let mut want = [ep(home_announced), ep(home_observed)];
    want.sort();
    assert_eq!(seen, want, "the candidates: announced, then observed");
    let third = wait(second.clone()).await;
    println!("-> {third} at {}", unix_now());
    assert!(period() > second_period, "it moved with the next period");
    assert_eq!(third, first, "two candidates: it cycles");
    assert_eq!(endpoint_of(&states, "cloud", HOME), cloud_home, "a live peer's endpoint stays");
    assert_eq!(cloud_home.as_deref(), Some(home_announced));

    // Only bytes change: no recompute (unless a period began meanwhile).
    let slot = || unix_now() / 20;
    let (computes, before) = (hub.computes(), slot());
    cloud
        .report(vec![
            peer(HOME, home_observed, Some(3), 99_999, 88_888),
            peer(VM, "172.31.5.4:51820", None, 0, 296),
            peer(STRANGER, "", None, 0, 0),
        ])
        .await;
    common::within(Duration::from_secs(10), "the new bytes", || {
        match series("kuport_overlay_peer_receive_bytes_total", "cloud", "home").as_deref() {
            Some("99999") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    if slot() == before {
        assert_eq!(hub.computes(), computes, "a report of bytes alone recomputes nothing");
    }

    // cloud's executor goes: the series of its report go with it (its routes, computed, stay).
    drop(cloud.tx);
    cloud.task.abort();
    common::within(Duration::from_secs(10), "cloud's series leave /metrics", || {
        let m = metrics(&metrics_address);
        let reported = ["receive_bytes", "transmit_bytes", "last_handshake"];
        let mine = |l: &&str| {
            reported.iter().any(|r| l.starts_with(&format!("kuport_overlay_peer_{r}"))) && l.contains("{node=\"cloud\"")
        };
        match m.lines().find(mine) {
            Some(l) => Err(l.to_string()),
            None => Ok(()),
        }
    })
    .await;
    assert!(series("kuport_overlay_peer_receive_bytes_total", "vm", "cloud").is_some(), "vm's stay");
    drop((home, vm));
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
}
