//! What an executor may report (docs/security.md): through the hub as NodeSync hands it
//! messages. A forged underlay is refused and changes no other node's state; a report out of
//! bounds is refused whole and the previous facts stay in use; arbitrary bytes and arbitrary
//! reports never panic the decode, the check or the compute, and every refusal names its
//! node, field and reason in the class status.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use kuport_controller::compute::Settings;
use kuport_controller::observe::facts::{self, reason};
use kuport_controller::render;
use kuport_controller::stream::{Hub, leader};
use kuport_proto::v1::{ExecutorMessage, Hello, InterfaceFacts, NodeFacts, executor_message};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use prost::Message;

const NODES: [&str; 4] = ["edge-a", "worker-1", "worker-2", "worker-3"];

/// A standalone hub on examples/cluster with every node's executor connected.
fn hub() -> Arc<Hub> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let cluster = render::load_dir(&dir, k8s_openapi::jiff::Timestamp::now()).expect("examples load");
    let (tx, rx) = leader::standalone("127.0.0.1:1".into());
    // The sender must outlive the hub's sessions; the tests never change leadership.
    std::mem::forget(tx);
    let hub = Hub::new(Settings::default(), rx, true);
    hub.set_inputs(cluster);
    for node in NODES {
        let _ = hub.connect(&Hello { node: node.into(), executor_version: "test".into(), applied: None });
    }
    hub
}

/// What `node`'s executor truly reports: its Node's InternalIP as underlay (examples/cluster).
fn true_facts(node: &str) -> NodeFacts {
    let underlay = match node {
        "edge-a" => "100.64.93.143",
        "worker-1" => "100.64.0.11",
        "worker-2" => "100.64.0.12",
        _ => "100.64.0.13",
    };
    let mut interfaces = vec![InterfaceFacts { name: "wt0".into(), mtu: 1420, addresses: vec![underlay.into()] }];
    if node == "edge-a" {
        interfaces
            .insert(0, InterfaceFacts { name: "enp1s0".into(), mtu: 1500, addresses: vec!["203.0.113.9".into()] });
    }
    NodeFacts {
        underlay_address: underlay.into(),
        underlay_mtu: 1420,
        underlay_interface: "wt0".into(),
        interfaces,
        kernel: "6.12.0".into(),
        ..Default::default()
    }
}

fn report(hub: &Hub, node: &str, f: NodeFacts) {
    hub.receive(node, ExecutorMessage { message: Some(executor_message::Message::Facts(f)) });
    hub.recompute();
}

fn versions(hub: &Hub) -> BTreeMap<String, String> {
    hub.nodes().into_iter().filter_map(|n| Some((n.node, n.desired?.version.clone()))).collect()
}

/// The class status rows' messages about `node`, every class.
fn row_messages(hub: &Hub, node: &str) -> Vec<String> {
    let (out, _) = hub.outputs();
    out.classes.values().flat_map(|c| &c.nodes).filter(|r| r.name == node).map(|r| r.message.clone()).collect()
}

fn without(v: &BTreeMap<String, String>, node: &str) -> BTreeMap<String, String> {
    v.iter().filter(|(n, _)| *n != node).map(|(n, v)| (n.clone(), v.clone())).collect()
}

#[test]
fn a_forged_underlay_is_refused_and_changes_no_other_node() {
    let hub = hub();
    for node in NODES {
        report(&hub, node, true_facts(node));
    }
    let before = versions(&hub);
    assert_eq!(before.len(), NODES.len());
    assert!(row_messages(&hub, "edge-a").iter().all(String::is_empty), "{:?}", row_messages(&hub, "edge-a"));
    // worker-2's address, then one that is no node's: edge-a's Node lists neither.
    for forged in ["100.64.0.12", "100.64.0.66"] {
        let mut f = true_facts("edge-a");
        f.underlay_address = forged.into();
        report(&hub, "edge-a", f);
        let messages = row_messages(&hub, "edge-a");
        assert!(!messages.is_empty());
        for m in &messages {
            assert!(
                m.contains(reason::UNDERLAY_NOT_NODE_ADDRESS) && m.contains("underlayAddress") && m.contains(forged),
                "{m}"
            );
        }
        assert_eq!(without(&versions(&hub), "edge-a"), without(&before, "edge-a"), "{forged}: other nodes changed");
        // edge-a itself still builds its links on its Node's address.
        assert_eq!(versions(&hub), before, "{forged}: edge-a's links moved");
        let (out, _) = hub.outputs();
        let row = out.classes["public"].nodes.iter().find(|r| r.name == "edge-a").cloned().unwrap();
        assert_eq!(row.underlay_address.as_deref(), Some("100.64.93.143"));
    }
    report(&hub, "edge-a", true_facts("edge-a"));
    assert!(row_messages(&hub, "edge-a").iter().all(String::is_empty));
}

#[test]
fn a_report_out_of_bounds_is_refused_whole_and_the_previous_facts_stay() {
    let hub = hub();
    for node in NODES {
        report(&hub, node, true_facts(node));
    }
    let before = versions(&hub);
    let mut bad = true_facts("edge-a");
    bad.underlay_mtu = 67;
    bad.interfaces[0].addresses = vec!["198.51.100.1".into()];
    report(&hub, "edge-a", bad);
    assert_eq!(versions(&hub), before, "the refused report's address is not used");
    let messages = row_messages(&hub, "edge-a");
    assert!(messages.iter().all(|m| m.contains(reason::INVALID_FACTS) && m.contains("underlayMtu")), "{messages:?}");
    let kept = hub.node("edge-a").and_then(|n| n.facts).unwrap();
    assert_eq!(kept, true_facts("edge-a"), "Debug shows the facts in use");
    assert_eq!(hub.metrics().facts_refused.get(), 1);
    report(&hub, "edge-a", true_facts("edge-a"));
    assert!(row_messages(&hub, "edge-a").iter().all(String::is_empty));
}

/// Strings that are sometimes valid (an address, an interface name) and sometimes anything.
fn text(valid: &'static str) -> impl Strategy<Value = String> {
    prop_oneof![3 => valid, 1 => any::<String>(), 1 => "[ -~]{0,20}"]
}

fn interface() -> impl Strategy<Value = InterfaceFacts> {
    let addresses = prop_oneof![
        4 => proptest::collection::vec(text("10\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}"), 0..4),
        1 => proptest::collection::vec(Just("10.0.0.1".to_string()), 60..70),
    ];
    (text("(enp1s0|wt0|eth[0-9]|lxc[0-9a-f]{1,12})"), any::<u32>(), addresses)
        .prop_map(|(name, mtu, addresses)| InterfaceFacts { name, mtu, addresses })
}

fn node_facts() -> impl Strategy<Value = NodeFacts> {
    let interfaces = prop_oneof![
        8 => proptest::collection::vec(interface(), 0..6),
        1 => (1020usize..1030).prop_map(|n| (0..n)
            .map(|i| InterfaceFacts { name: format!("lxc{i}"), mtu: 1500, addresses: vec![] })
            .collect()),
    ];
    let mtu = prop_oneof![Just(0u32), 1200u32..1300, 65_500u32..65_600, any::<u32>()];
    let underlay = prop_oneof![
        Just("100.64.93.143".to_string()),
        Just("100.64.0.12".to_string()),
        text("(100\\.64\\.[0-9]{1,3}\\.[0-9]{1,3}|)"),
    ];
    (underlay, mtu, text("(wt0|eth0|)"), interfaces, text("[0-9.a-z-]{0,70}")).prop_map(
        |(underlay_address, underlay_mtu, underlay_interface, interfaces, kernel)| NodeFacts {
            underlay_address,
            underlay_mtu,
            underlay_interface,
            interfaces,
            kernel,
            ..Default::default()
        },
    )
}

/// What NodeSync does with one message from `node`'s stream, and what must hold after: the
/// compute runs, and a refused report is named in the class status with its field.
fn feed(hub: &Hub, node: &str, m: ExecutorMessage) -> Result<(), TestCaseError> {
    let checked = match &m.message {
        Some(executor_message::Message::Facts(f)) => Some(facts::check(node, f)),
        _ => None,
    };
    hub.receive(node, m);
    let Some(checked) = checked else { return Ok(()) };
    hub.recompute();
    let messages = row_messages(hub, node);
    match checked {
        Ok(f) => {
            prop_assert!(
                f.underlay_mtu.is_none_or(|m| (facts::MIN_UNDERLAY_MTU..=facts::MAX_UNDERLAY_MTU).contains(&m))
            );
            let ifaces = f.interfaces.unwrap_or_default();
            prop_assert!(ifaces.len() <= facts::MAX_INTERFACES);
            prop_assert!(ifaces.iter().all(|i| facts::valid_interface_name(&i.name)));
            prop_assert!(ifaces.iter().all(|i| i.addresses.len() <= facts::MAX_ADDRESSES));
            prop_assert!(messages.iter().all(|m| !m.contains(reason::INVALID_FACTS)), "{messages:?}");
            // An underlay other than the Node's one address is refused, named, and not used.
            let own = true_facts(node).underlay_address;
            let forged = f.underlay_address.map(|a| a.to_string()).filter(|a| *a != own);
            for m in &messages {
                match &forged {
                    Some(a) => {
                        prop_assert!(m.contains(reason::UNDERLAY_NOT_NODE_ADDRESS) && m.contains(a.as_str()), "{m}")
                    }
                    None => prop_assert!(!m.contains(reason::UNDERLAY_NOT_NODE_ADDRESS), "{m}"),
                }
            }
            let (out, _) = hub.outputs();
            for row in out.classes.values().flat_map(|c| &c.nodes).filter(|r| r.name == node) {
                prop_assert_eq!(row.underlay_address.as_deref(), Some(own.as_str()));
            }
        }
        Err(r) => {
            prop_assert_eq!(r.reason, reason::INVALID_FACTS);
            prop_assert!(!r.field.is_empty() && !r.message.is_empty());
            prop_assert!(r.to_string().contains(node));
            let said = format!("{}: {}: {}", r.reason, r.field, r.message);
            prop_assert!(messages.iter().all(|m| m.contains(&said)), "{said} not in {messages:?}");
        }
    }
    Ok(())
}

#[test]
fn arbitrary_reports_never_panic_and_every_refusal_is_named() {
    let hub = hub();
    let mut runner = TestRunner::new(Config { cases: 1000, failure_persistence: None, ..Config::default() });
    runner
        .run(&node_facts(), |f| {
            feed(&hub, "edge-a", ExecutorMessage { message: Some(executor_message::Message::Facts(f)) })
        })
        .unwrap();
}

#[test]
fn arbitrary_bytes_never_panic_the_decode_or_the_check() {
    let hub = hub();
    let valid =
        ExecutorMessage { message: Some(executor_message::Message::Facts(true_facts("worker-2"))) }.encode_to_vec();
    // Random bytes, and valid encodings with bytes overwritten (which decode far more often).
    let mutated = proptest::collection::vec((0..valid.len(), any::<u8>()), 1..6).prop_map(move |edits| {
        let mut b = valid.clone();
        for (i, x) in edits {
            b[i] = x;
        }
        b
    });
    let bytes = prop_oneof![proptest::collection::vec(any::<u8>(), 0..512), mutated];
    let mut runner = TestRunner::new(Config { cases: 4000, failure_persistence: None, ..Config::default() });
    runner
        .run(&bytes, |b| match ExecutorMessage::decode(b.as_slice()) {
            Ok(m) => feed(&hub, "worker-2", m),
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                Ok(())
            }
        })
        .unwrap();
}

/// The largest report the bounds admit fits the NodeSync server's limit on executor messages
/// (docs/security.md, "Message size"), with room to spare.
#[test]
fn the_largest_accepted_report_fits_the_executor_message_limit() {
    let f = NodeFacts {
        underlay_address: "255.255.255.254".into(),
        underlay_mtu: facts::MAX_UNDERLAY_MTU,
        underlay_interface: "x".repeat(facts::MAX_INTERFACE_NAME),
        interfaces: (0..facts::MAX_INTERFACES)
            .map(|i| InterfaceFacts {
                name: format!("{i:0>15}"),
                mtu: facts::MAX_INTERFACE_MTU,
                addresses: vec!["255.255.255.254".into(); facts::MAX_ADDRESSES],
            })
            .collect(),
        kernel: "k".repeat(facts::MAX_KERNEL),
        wireguard_public_key: "/".repeat(facts::WIREGUARD_KEY_LEN - 2) + "8=",
        routes: (0..facts::MAX_ROUTES as u32)
            .map(|i| kuport_proto::v1::RouteFacts {
                dst: format!("{}/32", std::net::Ipv4Addr::from(0xdf00_0000 + i)),
                dev: "x".repeat(facts::MAX_INTERFACE_NAME),
            })
            .collect(),
        vxlan_ports: (65_535 - facts::MAX_VXLAN_PORTS as u32 + 1..=65_535).collect(),
    };
    let f = NodeFacts { underlay_interface: f.interfaces[0].name.clone(), ..f };
    assert!(facts::check("edge-a", &f).is_ok());
    let size = ExecutorMessage { message: Some(executor_message::Message::Facts(f)) }.encoded_len();
    println!("largest accepted report: {size} bytes");
    assert!(size * 3 < kuport_controller::serve::MAX_EXECUTOR_MESSAGE, "{size} bytes");
}

/// Over NodeSync itself: a stream's facts are its Hello's node's, whatever it sends later (a
/// second Hello naming another node included), and a message above the executor limit ends the
/// stream without touching the facts in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reports_for_its_hellos_node_only_and_within_the_limit() {
    use kuport_proto::v1::node_sync_client::NodeSyncClient;
    use std::time::{Duration, Instant};
    use tokio_stream::wrappers::ReceiverStream;

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let cluster = render::load_dir(&dir, k8s_openapi::jiff::Timestamp::now()).expect("examples load");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let (_lead, rx) = leader::standalone(address.clone());
    let hub = Hub::new(Settings::default(), rx, true);
    hub.set_inputs(cluster);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(kuport_controller::serve::serve_grpc(hub.clone(), listener, Default::default(), async {
        let _ = stopped.await;
    }));
    let facts_of = |node: &str| hub.node(node).and_then(|n| n.facts);
    let until = |what: &str, f: &dyn Fn() -> bool| {
        let started = Instant::now();
        while !f() {
            assert!(started.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    let mut client = loop {
        if let Ok(c) = NodeSyncClient::connect(format!("http://{address}")).await {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let send = |m: executor_message::Message| {
        let tx = tx.clone();
        async move { tx.send(ExecutorMessage { message: Some(m) }).await.expect("send") }
    };
    let hello = |node: &str| Hello { node: node.into(), executor_version: "test".into(), applied: None };
    send(executor_message::Message::Hello(hello("worker-2"))).await;
    send(executor_message::Message::Facts(true_facts("worker-2"))).await;
    let mut inbound = client.sync(ReceiverStream::new(rx)).await.expect("sync").into_inner();
    until("worker-2's facts arrive", &|| facts_of("worker-2").is_some());
    let mut claimed = true_facts("edge-a");
    claimed.kernel = "claimed".into();
    send(executor_message::Message::Hello(hello("edge-a"))).await;
    send(executor_message::Message::Facts(claimed.clone())).await;
    until("the second report arrives", &|| facts_of("worker-2") == Some(claimed.clone()));
    assert_eq!(facts_of("edge-a"), None, "a stream never reports for another node");

    // Below the limit a report out of bounds is decoded and refused; above it the stream
    // ends. The facts in use stay either way.
    let mut big = true_facts("worker-2");
    big.kernel = "k".repeat(3 << 20);
    send(executor_message::Message::Facts(big)).await;
    until("the 3 MiB report is refused", &|| hub.metrics().facts_refused.get() == 1);
    let mut huge = true_facts("worker-2");
    huge.kernel = "k".repeat(kuport_controller::serve::MAX_EXECUTOR_MESSAGE + 1);
    send(executor_message::Message::Facts(huge)).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match inbound.message().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    })
    .await
    .expect("the stream ends");
    println!("after the oversize message: {ended:?}");
    assert_eq!(facts_of("worker-2"), Some(claimed));
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
}

/// Over NodeSync: a second stream that says Hello for a node ends the first (ABORTED, named),
/// and only the newest stream's facts count from its Hello on (docs/security.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_stream_for_a_node_ends_the_older_one() {
    use kuport_proto::v1::node_sync_client::NodeSyncClient;
    use std::time::{Duration, Instant};
    use tokio_stream::wrappers::ReceiverStream;

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let cluster = render::load_dir(&dir, k8s_openapi::jiff::Timestamp::now()).expect("examples load");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let (_lead, rx) = leader::standalone(address.clone());
    let hub = Hub::new(Settings::default(), rx, true);
    hub.set_inputs(cluster);
    // States to send down (serve_grpc runs no recompute loop).
    hub.recompute();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(kuport_controller::serve::serve_grpc(hub.clone(), listener, Default::default(), async {
        let _ = stopped.await;
    }));
    let facts_of = |node: &str| hub.node(node).and_then(|n| n.facts);
    let until = |what: &str, f: &dyn Fn() -> bool| {
        let started = Instant::now();
        while !f() {
            assert!(started.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let client = loop {
        if let Ok(c) = NodeSyncClient::connect(format!("http://{address}")).await {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let kernel = |k: &str| {
        let mut f = true_facts("worker-1");
        f.kernel = k.into();
        executor_message::Message::Facts(f)
    };
    let hello = executor_message::Message::Hello(Hello {
        node: "worker-1".into(),
        executor_version: "test".into(),
        applied: None,
    });
    let kernel_of = || facts_of("worker-1").map(|f| f.kernel);
    let msg = |m: executor_message::Message| ExecutorMessage { message: Some(m) };
    // The server answers the call once it has read Hello: Hello goes first.
    let open = |mut client: NodeSyncClient<tonic::transport::Channel>| {
        let said = msg(hello.clone());
        async move {
            let (tx, rx) = tokio::sync::mpsc::channel::<ExecutorMessage>(8);
            tx.send(said).await.expect("send");
            let inbound = client.sync(ReceiverStream::new(rx)).await.expect("sync").into_inner();
            (tx, inbound)
        }
    };

    let (first, mut first_in) = open(client.clone()).await;
    first.send(msg(kernel("first"))).await.expect("send");
    until("the first stream's facts arrive", &|| kernel_of().as_deref() == Some("first"));

    let (second, mut second_in) = open(client.clone()).await;
    second.send(msg(kernel("second"))).await.expect("send");
    until("the second stream's facts arrive", &|| kernel_of().as_deref() == Some("second"));
    // Sent on the first stream after the second's Hello: dropped, whether or not the first
    // stream has ended yet.
    let _ = first.send(msg(kernel("late"))).await;

    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match first_in.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await
    .expect("the first stream ends")
    .expect("with a status");
    assert_eq!(ended.code(), tonic::Code::Aborted, "{ended:?}");
    assert_eq!(ended.message(), "superseded by a newer stream for node worker-1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(kernel_of().as_deref(), Some("second"), "the older stream's facts are not used");

    // The second stream keeps working: it receives the node's state and its facts count.
    let state = tokio::time::timeout(Duration::from_secs(10), second_in.message())
        .await
        .expect("a state in time")
        .expect("the second stream is alive");
    assert!(state.is_some(), "the second stream receives the node's state");
    second.send(msg(kernel("third"))).await.expect("send");
    until("the second stream's later facts arrive", &|| kernel_of().as_deref() == Some("third"));
    assert!(hub.node("worker-1").is_some_and(|n| n.connected));
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
}
