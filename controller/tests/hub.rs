//! The hub's bookkeeping of which executor holds which mapping: a change to one PortMap makes
//! only that PortMap wait for the nodes' acknowledgements, not every PortMap on those nodes
//! (a status write storm on each unrelated change, seen in the latency benchmark).

use std::path::Path;

use kuport_controller::compute::{ObjectKey, Settings};
use kuport_controller::render;
use kuport_controller::stream::{Hub, leader};
use kuport_proto::v1::{Ack, ExecutorMessage, Hello, executor_message};

fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::port_map(ns, name)
}

/// Acks what the hub currently wants on `node`.
fn ack(hub: &Hub, node: &str) {
    let d = hub.node(node).and_then(|v| v.desired).expect("a desired state");
    let ack = Ack { term: d.term, sequence: d.sequence, version: d.version.clone(), ok: true, errors: Vec::new() };
    hub.receive(node, ExecutorMessage { message: Some(executor_message::Message::Ack(ack)) });
}

#[test]
fn one_port_map_changing_leaves_the_others_on_its_nodes_acknowledged() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut cluster = render::load_dir(&dir, now).expect("examples load");
    let (_tx, rx) = leader::standalone("127.0.0.1:1".into());
    let hub = Hub::new(Settings::default(), rx, true);
    hub.set_inputs(cluster.clone());
    hub.recompute();
    for node in ["edge-a", "worker-2"] {
        // No facts come: each first state goes out when its hold times out.
        let session = hub.connect(&Hello { node: node.into(), executor_version: "test".into(), applied: None });
        hub.release_hold(node, session.id);
    }
    let (web, game) = (key("web", "web"), key("games", "game"));
    let (edge, pod) = (vec!["edge-a".to_string()], vec!["edge-a".to_string(), "worker-2".to_string()]);
    assert_eq!(hub.unacked(&web, edge.clone()), edge, "nothing acked yet");
    ack(&hub, "edge-a");
    ack(&hub, "worker-2");
    assert!(hub.unacked(&web, edge.clone()).is_empty());
    assert!(hub.unacked(&game, pod.clone()).is_empty());

    // web (on edge-a) moves to another port: edge-a gets a new state.
    let before = hub.node("edge-a").and_then(|v| v.desired).expect("state").version.clone();
    let pm = cluster.port_maps.iter_mut().find(|p| p.metadata.name.as_deref() == Some("web")).expect("web");
    pm.spec.port = 8443;
    hub.set_inputs(cluster);
    hub.recompute();
    let after = hub.node("edge-a").and_then(|v| v.desired).expect("state").version.clone();
    assert_ne!(before, after, "edge-a's state changed");
    assert_eq!(hub.unacked(&web, edge.clone()), edge, "web waits for edge-a");
    assert!(hub.unacked(&game, pod.clone()).is_empty(), "game, unchanged, is still held by edge-a");
    ack(&hub, "edge-a");
    assert!(hub.unacked(&web, edge).is_empty());
}

/// Facts that differ only in interfaces no class names on the node (a pod's veth) do not
/// recompute: each recompute held up real changes (latency benchmark).
#[tokio::test]
async fn only_facts_the_computation_reads_trigger_a_recompute() {
    use kuport_proto::v1::{InterfaceFacts, NodeFacts};
    use std::time::Duration;

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let cluster = render::load_dir(&dir, k8s_openapi::jiff::Timestamp::now()).expect("examples load");
    let (_tx, rx) = leader::standalone("127.0.0.1:1".into());
    let hub = Hub::new(Settings::default(), rx, true);
    hub.set_inputs(cluster);
    tokio::spawn(hub.clone().recompute_loop(None));
    let _ = hub.connect(&Hello { node: "edge-a".into(), executor_version: "test".into(), applied: None });
    let iface =
        |name: &str, address: &str| InterfaceFacts { name: name.into(), mtu: 1500, addresses: vec![address.into()] };
    let facts = |interfaces: Vec<InterfaceFacts>| ExecutorMessage {
        message: Some(executor_message::Message::Facts(NodeFacts {
            underlay_address: "100.64.0.10".into(),
            underlay_mtu: 1500,
            underlay_interface: "wt0".into(),
            interfaces,
            kernel: "test".into(),
            ..Default::default()
        })),
    };
    // Waits past the pace, then returns how many computes ran so far.
    let settled = || async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        hub.computes()
    };
    let base = vec![iface("enp1s0", "203.0.113.9"), iface("wt0", "100.64.0.10")];
    hub.receive("edge-a", facts(base.clone()));
    let first = settled().await;
    assert!(first >= 1, "the first facts compute");

    let mut with_veth = base.clone();
    with_veth.push(iface("lxc1234", "fe80::1"));
    hub.receive("edge-a", facts(with_veth));
    assert_eq!(settled().await, first, "a pod's veth is not read by the computation");

    hub.receive("edge-a", facts(vec![iface("enp1s0", "203.0.113.10"), iface("wt0", "100.64.0.10")]));
    assert_eq!(settled().await, first + 1, "a named interface's address is");
}

/// A fresh executor's first state waits for its facts (docs/portmap/datapath.md, "Which device
/// reaches the pod"): sent before them, it lacked the request claim on the pod's device, and the
/// first flows reached the pod from the node's address (the chart lab saw 10.244.2.1).
#[tokio::test]
async fn a_fresh_executors_first_state_waits_for_its_facts_and_carries_the_claim() {
    use kuport_proto::v1::{NodeFacts, RouteFacts};

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let mut cluster = render::load_dir(&dir, k8s_openapi::jiff::Timestamp::now()).expect("examples load");
    // No routes but what the executor reports.
    for f in &mut cluster.facts {
        f.routes = None;
    }
    let (_tx, rx) = leader::standalone("127.0.0.1:1".into());
    let hub = Hub::new(Settings::default(), rx, true);
    hub.set_inputs(cluster);
    hub.recompute();
    let text = |hub: &Hub| {
        let d = hub.node("worker-2").and_then(|v| v.desired).expect("a desired state");
        kuport_proto::text::node_state(d.state.as_ref().expect("a state"))
    };
    assert!(!text(&hub).contains("\"cilium_host\" . 10.244.2.107"), "no claim without the routes");

    let session = hub.connect(&Hello { node: "worker-2".into(), executor_version: "test".into(), applied: None });
    assert!(*session.held.borrow() && session.hold_until.is_some(), "held until its facts");
    let facts = NodeFacts {
        underlay_address: "100.64.0.12".into(),
        underlay_mtu: 1420,
        underlay_interface: "wt0".into(),
        kernel: "test".into(),
        routes: vec![RouteFacts { dst: "10.244.2.0/24".into(), dev: "cilium_host".into() }],
        ..Default::default()
    };
    hub.receive("worker-2", ExecutorMessage { message: Some(executor_message::Message::Facts(facts)) });
    assert!(*session.held.borrow(), "until a compute read them");
    hub.recompute();
    assert!(!*session.held.borrow(), "let go by the compute that read the facts");
    assert!(
        text(&hub).contains("\"cilium_host\" . 10.244.2.107"),
        "the first state sent claims the pod:\n{}",
        text(&hub)
    );

    // A reconnect with facts known is not held.
    let again = hub.connect(&Hello { node: "worker-2".into(), executor_version: "test".into(), applied: None });
    assert!(!*again.held.borrow() && again.hold_until.is_none());
}

/// Recomputes are paced, not debounced (docs/decisions.md, "Recomputes are paced, not
/// debounced"): a change after a quiet spell is computed at once, where a debounce waited 100 ms
/// of quiet first; the changes of a burst that follows wait out the pace together and are read by
/// one compute.
#[tokio::test(start_paused = true)]
async fn a_change_after_quiet_computes_at_once_and_a_burst_once_after_the_pace() {
    use kuport_controller::stream::hub::PACE;
    use std::time::Duration;
    use tokio::time::Instant;

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let cluster = render::load_dir(&dir, k8s_openapi::jiff::Timestamp::now()).expect("examples load");
    let with_port = |port: u16| {
        let mut c = cluster.clone();
        let pm = c.port_maps.iter_mut().find(|p| p.metadata.name.as_deref() == Some("web")).expect("web");
        pm.spec.port = port;
        c
    };
    let (_tx, rx) = leader::standalone("127.0.0.1:1".into());
    let hub = Hub::new(Settings::default(), rx, true);
    hub.set_inputs(cluster.clone());
    tokio::spawn(hub.clone().recompute_loop(None));
    // The paused clock stands still while a compute runs (a blocking task): what passes is the
    // loop's own waiting.
    let computed = |n: u64| {
        let hub = hub.clone();
        async move {
            let start = Instant::now();
            while hub.computes() < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            start.elapsed()
        }
    };
    assert!(computed(1).await < Duration::from_millis(5), "the first inputs compute at once");

    tokio::time::sleep(Duration::from_secs(1)).await;
    hub.set_inputs(with_port(8443));
    let waited = computed(2).await;
    assert!(waited < Duration::from_millis(5), "a change after a quiet spell waited {waited:?}");
    let second = Instant::now();

    // A burst right after: five changes 10 ms apart, all inside the pace.
    for port in 8444..8449 {
        hub.set_inputs(with_port(port));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    computed(3).await;
    assert!(second.elapsed() >= PACE - Duration::from_millis(5), "the burst waited out the pace");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(hub.computes(), 3, "one compute read the whole burst");

    // ... and it read the last of it: its node states are those of the last inputs.
    let last = Hub::new(Settings::default(), leader::standalone("127.0.0.1:1".into()).1, true);
    last.set_inputs(with_port(8448));
    last.recompute();
    let versions = |hub: &Hub| -> Vec<String> {
        let (outputs, _) = hub.outputs();
        outputs.node_states.values().map(|s| kuport_proto::canonical_version(s)).collect()
    };
    assert_eq!(versions(&hub), versions(&last));
}
