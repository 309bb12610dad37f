//! The controller against a real kube-apiserver and etcd (e2e/controlplane builds and starts
//! them; e2e/test.sh builds them before `cargo test`). Executors are faked in-process: gRPC
//! clients over TLS, each with its node's Pod-bound token, that acknowledge states when the
//! test lets them.
//!
//! One control plane for the whole file; the scenarios run in order in one test, since later
//! ones build on the objects of earlier ones (failover keeps what the first leader wrote).

mod common;
use common::{ControlPlane, Controller, bearer, free_address, node_sync, repo, within};

const LOG_LEVEL: &str = "info,kube=warn";

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kuport_controller::report::status::RECONNECT_GRACE;
use kuport_proto::v1::{
    Ack, Applied, ExecutorMessage, Hello, InterfaceFacts, NodeFacts, controller_message, executor_message,
};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

/// What the fake executors and the Debug calls present: the controller's CA and tokens.
#[derive(Clone)]
struct Trust {
    ca: Vec<u8>,
    /// A token allowed Debug (the test's ServiceAccount).
    debug: String,
}

/// A fake executor: says Hello (with what it applied before) over TLS with its node's token,
/// follows NotLeader, tries the given addresses in turn, and acknowledges each state once `ack`
/// is true. Publishes the (term, version) of each state it acked; stops when the task is aborted.
fn fake_executor(
    node: &'static str,
    addresses: Vec<String>,
    ack: watch::Receiver<bool>,
    ca: Vec<u8>,
    token: String,
) -> (watch::Receiver<Vec<(u64, String)>>, tokio::task::JoinHandle<()>) {
    let (acked_tx, acked_rx) = watch::channel(Vec::new());
    let task = tokio::spawn(async move {
        let mut applied: Option<Applied> = None;
        let mut next: Option<String> = None;
        let mut i = 0;
        loop {
            let address = next.take().unwrap_or_else(|| {
                i += 1;
                addresses[i % addresses.len()].clone()
            });
            let Ok(mut client) = node_sync(&address, &ca).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let (tx, rx) = mpsc::channel(8);
            let hello = Hello { node: node.into(), executor_version: "fake".into(), applied: applied.clone() };
            let _ = tx.send(ExecutorMessage { message: Some(executor_message::Message::Hello(hello)) }).await;
            let _ = tx.send(ExecutorMessage { message: Some(executor_message::Message::Facts(facts(node))) }).await;
            let Ok(resp) = client.sync(bearer(&token, ReceiverStream::new(rx))).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let mut inbound = resp.into_inner();
            while let Ok(Some(m)) = inbound.message().await {
                match m.message {
                    Some(controller_message::Message::NotLeader(n)) => {
                        next = (!n.leader.is_empty()).then_some(n.leader);
                        if next.is_none() {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        break;
                    }
                    Some(controller_message::Message::State(ds)) => {
                        let mut ack = ack.clone();
                        let _ = ack.wait_for(|a| *a).await;
                        let a = Ack {
                            term: ds.term,
                            sequence: ds.sequence,
                            version: ds.version.clone(),
                            ok: true,
                            errors: vec![],
                        };
                        applied = Some(Applied { term: ds.term, sequence: ds.sequence, version: ds.version.clone() });
                        let _ = tx.send(ExecutorMessage { message: Some(executor_message::Message::Ack(a)) }).await;
                        acked_tx.send_modify(|v| v.push((ds.term, ds.version)));
                    }
                    // The leader's counter reads (every 15 s): this fake keeps no tables.
                    Some(controller_message::Message::ReadCounters(_)) | None => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (acked_rx, task)
}

/// What a fake executor reports: examples/cluster/facts.yaml's addresses, an underlay MTU of 1380.
fn facts(node: &str) -> NodeFacts {
    let iface = |name: &str, a: &str| InterfaceFacts { name: name.into(), mtu: 1380, addresses: vec![a.into()] };
    let (underlay, mut interfaces) = match node {
        "edge-a" => ("100.64.93.143", vec![iface("enp1s0", "203.0.113.9")]),
        _ => ("100.64.0.12", vec![]),
    };
    interfaces.push(iface("wt0", underlay));
    NodeFacts {
        underlay_address: underlay.into(),
        underlay_mtu: 1380,
        underlay_interface: "wt0".into(),
        interfaces,
        kernel: "test".into(),
        // The lab's Cilium-like pod network: every pod through cilium_host.
        routes: vec![kuport_proto::v1::RouteFacts { dst: "10.244.0.0/16".into(), dev: "cilium_host".into() }],
        ..Default::default()
    }
}

/// Pod `ns/name`'s status as its kubelet would write it: Running at `ip`.
fn pod_status(cp: &ControlPlane, ns: &str, name: &str, ip: &str) {
    let patch = format!(r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}]}}}}"#);
    cp.ok(&["patch", "pod", "-n", ns, name, "--subresource=status", "--type=merge", "-p", &patch], None);
}

fn condition(pm: &Value, type_: &str) -> (String, String, String) {
    let c = pm["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == type_));
    let s = |k: &str| c.and_then(|c| c[k].as_str()).unwrap_or_default().to_string();
    (s("status"), s("reason"), s("message"))
}

fn holder(cp: &ControlPlane) -> String {
    cp.kubectl(&["get", "lease", "-n", "default", "kuport-controller", "-o", "jsonpath={.spec.holderIdentity}"], None)
        .unwrap_or_default()
}

/// resourceVersion of every PortMap and PortMapClass: unchanged means nothing was written.
fn versions(cp: &ControlPlane) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for kind in ["pm", "pmc"] {
        let list = cp.json(&["get", kind, "-A"]);
        for o in list["items"].as_array().into_iter().flatten() {
            let m = &o["metadata"];
            out.push((
                format!("{kind} {}/{}", m["namespace"].as_str().unwrap_or(""), m["name"].as_str().unwrap_or("")),
                m["resourceVersion"].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    out.sort();
    out
}

/// Objects that make every other refusal reason appear, each PortMap in games (the game
/// Service's pods are on worker-2).
const REFUSED: &str = r#"
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata: {name: picky}
spec: {nodes: {edge-a: {interfaces: [enp1s0]}}, namespaceSelector: {matchLabels: {tier: gold}}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata: {name: direct}
spec: {nodes: {edge-a: {interfaces: [enp1s0]}}, returnPath: {mode: None}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata: {name: noiface}
spec: {nodes: {edge-a: {interfaces: [eth7]}}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata: {name: ninth}
spec: {nodes: {worker-9: {interfaces: [wt0]}}}
---
apiVersion: v1
kind: Node
metadata: {name: worker-9}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: orphan, namespace: games}
spec: {className: nope, protocol: UDP, port: 5000, serviceRef: {name: game}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: r-range, namespace: games}
spec: {className: public, protocol: UDP, port: 0, serviceRef: {name: game}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: r-outside, namespace: games}
spec: {className: public, protocol: UDP, port: 100, serviceRef: {name: game}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: r-reserved, namespace: games}
spec: {className: public, protocol: UDP, port: 4790, serviceRef: {name: game}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: r-iface, namespace: games}
spec: {className: public, protocol: UDP, port: 5001, interfaces: [eth9], serviceRef: {name: game}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: r-ns, namespace: games}
spec: {className: picky, protocol: UDP, port: 5002, serviceRef: {name: game}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: r-noendpoint, namespace: games}
spec: {className: public, protocol: UDP, port: 5003, serviceRef: {name: ghost}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: r-return, namespace: games}
spec: {className: direct, protocol: UDP, port: 5004, serviceRef: {name: game}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: r-noiface, namespace: games}
spec: {className: noiface, protocol: UDP, port: 5005, serviceRef: {name: game}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata: {name: r-notready, namespace: games}
spec: {className: ninth, protocol: UDP, port: 5006, serviceRef: {name: game}}
"#;

/// (PortMap, condition, reason) for [`REFUSED`].
const REFUSALS: &[(&str, &str, &str)] = &[
    ("orphan", "Accepted", "ClassNotFound"),
    ("r-range", "Accepted", "InvalidPortRange"),
    ("r-outside", "Accepted", "PortOutsideClassRange"),
    ("r-reserved", "Accepted", "ReservedPort"),
    ("r-iface", "Accepted", "InterfaceNotInClass"),
    ("r-ns", "Accepted", "NamespaceNotSelected"),
    ("r-noendpoint", "Programmed", "NoReadyEndpoint"),
    ("r-return", "Programmed", "ReturnPathUnavailable"),
    ("r-noiface", "Programmed", "NoInterfaceOnNode"),
    ("r-notready", "Programmed", "NodeNotReady"),
];

const BAD: &[(&str, &str)] = &[
    (
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMap\nmetadata: {name: bad-range, namespace: games}\nspec: {className: public, protocol: UDP, port: 3000, endPort: 2000, serviceRef: {name: game}}\n",
        "endPort must not be below port",
    ),
    (
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMapClass\nmetadata: {name: bad-port}\nspec: {nodes: {a: {interfaces: [eth0]}}, returnPath: {vxlan: {port: 0}}}\n",
        "port 0 is not a UDP port",
    ),
    (
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMapClass\nmetadata: {name: bad-subnet}\nspec: {nodes: {a: {interfaces: [eth0]}}, returnPath: {vxlan: {subnet: \"10.0.0.0/31\"}}}\n",
        "room for at least one /31",
    ),
    (
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMapClass\nmetadata: {name: bad-v6}\nspec: {nodes: {a: {interfaces: [eth0]}}, returnPath: {vxlan: {subnet: \"fd00::/64\"}}}\n",
        "must be an IPv4 CIDR",
    ),
    (
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMapClass\nmetadata: {name: bad-subnet6}\nspec: {nodes: {a: {interfaces: [eth0]}}, returnPath: {vxlan: {subnet6: \"10.0.0.0/24\"}}}\n",
        "subnet6 must be an IPv6 CIDR",
    ),
    (
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMapClass\nmetadata: {name: small-subnet6}\nspec: {nodes: {a: {interfaces: [eth0]}}, returnPath: {vxlan: {subnet6: \"fd64::/121\"}}}\n",
        "at least as many /127",
    ),
    (
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMap\nmetadata: {name: bad-range, namespace: web}\nspec: {className: public, protocol: TCP, port: 3000, serviceRef: {name: web}, sourceRanges: [192.0.2.0/24, \"192.0.2.300/24\"]}\n",
        "each sourceRanges entry must be a CIDR",
    ),
    (
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMapClass\nmetadata: {name: bad-range}\nspec: {nodes: {a: {interfaces: [eth0]}}, sourceRanges: [nope]}\n",
        "each sourceRanges entry must be a CIDR",
    ),
    (
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMapClass\nmetadata: {name: pin-nothing}\nspec: {nodes: {a: {interfaces: [eth0]}}, pinSourceRanges: true}\n",
        "pinSourceRanges needs sourceRanges",
    ),
    (
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMap\nmetadata: {name: no-rate, namespace: web}\nspec: {className: public, protocol: UDP, port: 3000, serviceRef: {name: web}, rateLimit: {newPerSecond: 0}}\n",
        "spec.rateLimit.newPerSecond: Invalid value: 0",
    ),
    (
        "apiVersion: kuport.wlz.li/v1alpha1\nkind: PortMap\nmetadata: {name: no-cap, namespace: web}\nspec: {className: public, protocol: TCP, port: 3000, serviceRef: {name: web}, rateLimit: {newPerSecond: 5, maxConnections: 0}}\n",
        "spec.rateLimit.maxConnections: Invalid value: 0",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crds_statuses_acks_failover_and_restart() {
    tokio::time::timeout(Duration::from_secs(240), scenario()).await.expect("the test hung");
}

async fn scenario() {
    let cp = ControlPlane::up("k8s");
    let examples = repo().join("examples/cluster");

    // CRDs install; the notes' examples apply unchanged; CEL rules refuse with their message.
    cp.apply_file(&repo().join("crds/kuport.wlz.li.yaml"));
    cp.established(&["crd/portmaps.kuport.wlz.li", "crd/portmapclasses.kuport.wlz.li"]);
    for f in ["classes", "nodes", "web", "game", "dns"] {
        cp.apply_file(&examples.join(format!("{f}.yaml")));
    }
    // The pods behind the examples' slices, as their kubelets would report them: what vouches
    // for each endpoint.
    for (ns, pod, ip) in
        [("web", "web-0", "10.244.18.7"), ("games", "game-0", "10.244.2.107"), ("intranet", "dns-0", "10.244.1.53")]
    {
        pod_status(&cp, ns, pod, ip);
    }
    // The executors' Pods, whose bound tokens prove their nodes.
    cp.executor_pods("default", &["edge-a", "worker-1", "worker-2", "worker-3"]);
    cp.ok(
        &["apply", "--server-side", "--subresource=status", "-f", &examples.join("nodes.yaml").display().to_string()],
        None,
    );
    for (yaml, message) in BAD {
        let err = cp.kubectl(&["apply", "-f", "-"], Some(yaml)).expect_err("the API server must refuse");
        assert!(err.contains(message), "expected {message:?} in: {err}");
    }
    let err =
        cp.kubectl(&["patch", "pm", "-n", "games", "game", "--type=merge", "-p", r#"{"spec":{"port":27016}}"#], None);
    assert!(err.expect_err("immutable").contains("port is immutable"));

    // A controller: Accepted at once, Programmed only after both executors acked.
    let (a1, a2) = (free_address(), free_address());
    let c1 = Controller::start(&cp, "c1", &a1, "default", &[], LOG_LEVEL);
    let game = || cp.json(&["get", "pm", "-n", "games", "game"]);
    within(Duration::from_secs(30), "game pending", || {
        let pm = game();
        match (condition(&pm, "Accepted").0.as_str(), condition(&pm, "Programmed")) {
            ("True", (s, r, m)) if s == "False" && r == "Pending" && m.contains("edge-a") && m.contains("worker-2") => {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Executors connect over TLS with the CA the controller published, each with its node's token.
    let trust = Trust { ca: cp.ca("default"), debug: cp.debug_token("default", "kuport-test-debug", true) };
    let (ack_tx, ack_rx) = watch::channel(false);
    let addresses = vec![a1.clone(), a2.clone()];
    let token = |node: &str| cp.executor_token("default", node);
    let (edge, edge_task) =
        fake_executor("edge-a", addresses.clone(), ack_rx.clone(), trust.ca.clone(), token("edge-a"));
    let (worker, _worker_task) =
        fake_executor("worker-2", addresses.clone(), ack_rx.clone(), trust.ca.clone(), token("worker-2"));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(condition(&game(), "Programmed").1, "Pending", "no ack yet, so not programmed");
    ack_tx.send_replace(true);
    let took =
        within(Duration::from_secs(5), "game programmed after the acks", || match condition(&game(), "Programmed") {
            (s, _, _) if s == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        })
        .await;
    println!("Programmed=True {took:?} after the executors acked");
    assert!(!edge.borrow().is_empty() && !worker.borrow().is_empty());
    // The reported facts are kept in the class status (a new leader starts from them), and
    // the published addresses come from the reported interfaces.
    let rows = cp.json(&["get", "pmc", "public"])["status"]["nodes"].clone();
    let row = rows.as_array().and_then(|r| r.iter().find(|n| n["name"] == "worker-2")).cloned().unwrap_or_default();
    assert_eq!((row["underlayMtu"].as_u64(), row["linkMtu"].as_u64()), (Some(1380), Some(1330)), "{rows}");
    let published = game()["status"]["published"].to_string();
    assert!(published.contains("203.0.113.9") && published.contains("enp1s0"), "{published}");
    let m = c1.metrics();
    for line in ["kuport_leader 1", "kuport_executors_connected 2", "kuport_node_in_sync{node=\"worker-2\"} 1"] {
        assert!(m.contains(line), "metrics lack {line:?}:\n{m}");
    }
    assert!(m.contains("kuport_reconciles_total") && m.contains("kuport_reconcile_seconds_bucket"), "{m}");

    // Refusals show in status and as events.
    let conflict = std::fs::read_to_string(examples.join("game.yaml")).expect("game.yaml");
    let conflict = conflict.replace(
        "name: game\n  namespace: games\n  creationTimestamp: \"2026-11-01T10:00:00Z\"",
        "name: game-copy\n  namespace: games",
    );
    cp.ok(&["apply", "-f", "-"], Some(&conflict));
    cp.ok(&["apply", "-f", "-"], Some(REFUSED));
    let mut cases = vec![("game-copy", "Accepted", "PortConflict")];
    cases.extend_from_slice(REFUSALS);
    for (name, type_, reason) in cases {
        within(Duration::from_secs(10), &format!("{name} refused"), || {
            let pm = cp.json(&["get", "pm", "-n", "games", name]);
            let accepted = condition(&pm, type_);
            let events = cp.ok(
                &[
                    "get",
                    "events",
                    "-n",
                    "games",
                    "--field-selector",
                    &format!("involvedObject.name={name}"),
                    "-o",
                    "jsonpath={.items[*].reason}",
                ],
                None,
            );
            if accepted.0 == "False" && accepted.1 == reason && events.contains(reason) {
                Ok(())
            } else {
                Err(format!("{accepted:?}, events {events:?}"))
            }
        })
        .await;
    }
    assert_eq!(condition(&game(), "Programmed").0, "True", "the winner keeps working");

    // Failover: a second replica; the leader is killed; the follower leads within 5 s and
    // writes nothing (same slots, same statuses, same resourceVersions).
    let c2 = Controller::start(&cp, "c2", &a2, "default", &[], LOG_LEVEL);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(holder(&cp).starts_with("c1@"), "c1 still leads: {}", holder(&cp));
    // c1 writes what it kept back when its reconnect grace ends (late on a busy machine).
    tokio::time::sleep_until(grace_end(&cp).into()).await;
    let before = quiet(&cp).await;
    let links = |cp: &ControlPlane| cp.json(&["get", "pmc", "public"])["status"]["links"].clone();
    let slots = links(&cp);
    let acks_before = worker.borrow().len();
    c1.signal("-KILL");
    let took = within(Duration::from_secs(5), "c2 leads after c1 was killed", || {
        let h = holder(&cp);
        if h.starts_with("c2@") { Ok(()) } else { Err(h) }
    })
    .await;
    println!("failover after SIGKILL: {took:?}");
    // The executors reconnect (to c2) and ack its new-term states.
    within(Duration::from_secs(10), "executors ack the new leader", || {
        if worker.borrow().len() > acks_before { Ok(()) } else { Err("no new ack".into()) }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(links(&cp), slots, "slots unchanged after failover");
    assert_eq!(versions(&cp), before, "the new leader rewrote no unchanged status");
    assert_eq!(condition(&game(), "Programmed").0, "True");

    // Restart: c1 comes back as a follower, c2 shuts down gracefully (releasing the lease),
    // c1 takes over quickly and renumbers nothing, rewrites nothing.
    drop(c1);
    let c1 = Controller::start(&cp, "c1", &a1, "default", &[], LOG_LEVEL);
    tokio::time::sleep(Duration::from_secs(2)).await;
    c2.signal("-TERM");
    let took = within(Duration::from_secs(5), "c1 leads after c2 stopped", || {
        let h = holder(&cp);
        if h.starts_with("c1@") { Ok(()) } else { Err(h) }
    })
    .await;
    println!("failover after SIGTERM: {took:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(links(&cp), slots, "slots unchanged after restart");
    assert_eq!(versions(&cp), before, "a restarted controller rewrote no unchanged status");

    // The pod moves to worker-1 (a new Pod there, running before its endpoint changes): the
    // status follows and an event says so.
    let moved = std::fs::read_to_string(examples.join("game.yaml"))
        .expect("game.yaml")
        .replace("[10.244.2.107]", "[10.244.1.107]")
        .replace("10.244.2.107", "10.244.1.107")
        .replace("game-0", "game-1")
        .replace("nodeName: worker-2", "nodeName: worker-1");
    let pod = moved.split("---\n").find(|d| d.contains("\nkind: Pod\n")).expect("game.yaml has the Pod");
    cp.ok(&["apply", "-f", "-"], Some(pod));
    pod_status(&cp, "games", "game-1", "10.244.1.107");
    cp.ok(&["apply", "-f", "-"], Some(&moved));
    // worker-1 has no executor and c1 leads for only a few seconds: its status waits for the
    // reconnect grace (10 s) to end.
    within(Duration::from_secs(20), "serving node change reported", || {
        let node = game()["status"]["endpoint"]["node"].as_str().unwrap_or_default().to_string();
        let events = cp.ok(
            &[
                "get",
                "events",
                "-n",
                "games",
                "--field-selector",
                "involvedObject.name=game",
                "-o",
                "jsonpath={.items[*].message}",
            ],
            None,
        );
        if node == "worker-1" && events.contains("now reached on node worker-1 (was worker-2)") {
            Ok(())
        } else {
            Err(format!("endpoint node {node}, events {events:?}"))
        }
    })
    .await;

    // A leader frozen past its lease (alive, not killed) is replaced; the world changes while
    // it is frozen; once it resumes it writes nothing (no status, slot claim, class row or
    // event) and sends its executors to the new leader instead of states.
    drop(c2);
    let c2 = Controller::start(&cp, "c2", &a2, "default", &[], LOG_LEVEL);
    within(Duration::from_secs(10), "c2 follows", || {
        if c2.metrics().contains("kuport_leader 0") { Ok(()) } else { Err("no metrics yet".into()) }
    })
    .await;
    quiet(&cp).await;
    assert!(holder(&cp).starts_with("c1@"), "c1 still leads: {}", holder(&cp));
    let c1_writes = api_writes(&c1);
    assert!(c1_writes > 0, "c1 counts the writes it made as leader");
    let c1_term = worker.borrow().last().map(|a| a.0).expect("worker-2 acked c1");
    let acks_before = (edge.borrow().len(), worker.borrow().len());
    // The pod moves back to worker-2 once c1 is frozen (one request): c1 resumes with the
    // watch event waiting and its recompute due. A recompute starts at once after a quiet
    // spell, so a change written just before the freeze could be computed and written first.
    c1.signal("-STOP");
    let frozen = Instant::now();
    let back = r#"[{"op":"replace","path":"/endpoints/0/nodeName","value":"worker-2"},
        {"op":"replace","path":"/endpoints/0/addresses","value":["10.244.2.107"]},
        {"op":"replace","path":"/endpoints/0/targetRef/name","value":"game-0"}]"#;
    cp.ok(&["patch", "endpointslice", "-n", "games", "game-abcde", "--type=json", "-p", back], None);
    let took = within(Duration::from_secs(10), "c2 leads while c1 is frozen", || {
        let h = holder(&cp);
        if h.starts_with("c2@") { Ok(()) } else { Err(h) }
    })
    .await;
    println!("takeover from a frozen leader: {took:?}");
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(frozen.elapsed())).await;
    c1.signal("-CONT");
    let resumed = Instant::now();
    let log = cp.dir.join("c1.log");
    let took = within(Duration::from_secs(5), "c1 says it lost the lease", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("no more writes") { Ok(()) } else { Err("no such log line".into()) }
    })
    .await;
    println!("c1 logged the loss {took:?} after SIGCONT");
    // The executors move to c2, which reports the serving node change.
    within(Duration::from_secs(10), "c2 reports the pod back on worker-2", || {
        let pm = game();
        let node = pm["status"]["endpoint"]["node"].as_str().unwrap_or_default().to_string();
        let events = cp.json(&["get", "events", "-n", "games", "--field-selector", "involvedObject.name=game"]);
        let by: Vec<String> = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| {
                e["message"].as_str().is_some_and(|m| m.contains("now reached on node worker-2 (was worker-1)"))
            })
            .map(|e| e["reportingInstance"].as_str().unwrap_or_default().to_string())
            .collect();
        match (node.as_str(), condition(&pm, "Programmed").0.as_str(), by.as_slice()) {
            ("worker-2", "True", [c]) if c == "c2" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    println!("c2 reported the move {:?} after SIGCONT", resumed.elapsed());
    // Quiet until past c2's reconnect grace too, when it writes what it kept back.
    let settled = quiet(&cp).await;
    tokio::time::sleep_until((Instant::now() + Duration::from_secs(2)).max(grace_end(&cp)).into()).await;
    assert_eq!(versions(&cp), settled, "nothing written once c2 settled");
    let m = c1.metrics();
    assert!(m.contains("kuport_leader 0"), "c1 does not lead:\n{m}");
    assert_eq!(api_writes(&c1), c1_writes, "c1 wrote nothing after it resumed:\n{m}");
    assert!(c2.metrics().contains("kuport_executors_connected 2"), "both executors on c2");
    for (acks, before) in [(&edge, acks_before.0), (&worker, acks_before.1)] {
        let after: Vec<u64> = acks.borrow()[before..].iter().map(|a| a.0).collect();
        assert!(
            !after.is_empty() && after.iter().all(|t| *t > c1_term),
            "only c2's states after the freeze: {after:?}"
        );
    }

    // A second move by the same leader gets its own event with its own message: the recorder
    // folds events that share regarding, reason and related object, whatever their notes.
    cp.ok(&["apply", "-f", "-"], Some(&moved));
    within(Duration::from_secs(10), "c2's second serving-node event", || {
        let events = cp.json(&["get", "events", "-n", "games", "--field-selector", "involvedObject.name=game"]);
        let found = events["items"].as_array().into_iter().flatten().any(|e| {
            e["reportingInstance"] == "c2"
                && e["message"].as_str().is_some_and(|m| m.contains("now reached on node worker-1 (was worker-2)"))
                && e["related"]["name"] == "worker-1"
        });
        if found { Ok(()) } else { Err(format!("{events}")) }
    })
    .await;

    // A kubelet heartbeat (a Node status update that keeps readiness and address) does not
    // recompute; a readiness change does.
    let reconciles = || {
        let m = c2.metrics();
        m.lines()
            .find_map(|l| l.strip_prefix("kuport_reconciles_total ")?.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no kuport_reconciles_total:\n{m}"))
    };
    let node_status = |ready: &str, heartbeat: &str| {
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: edge-a}}\nstatus:\n  addresses: [{{type: InternalIP, address: 100.64.93.143}}]\n  conditions: [{{type: Ready, status: \"{ready}\", lastHeartbeatTime: \"{heartbeat}\"}}]\n"
        )
    };
    let status_apply = ["apply", "--server-side", "--subresource=status", "--force-conflicts", "-f", "-"];
    // Quiet first: the move's status writes still recompute (the computation reads statuses).
    quiet(&cp).await;
    let mut before = reconciles();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = reconciles();
        if now == before {
            break;
        }
        before = now;
    }
    cp.ok(&status_apply, Some(&node_status("True", "2026-11-29T12:00:00Z")));
    cp.ok(&status_apply, Some(&node_status("True", "2026-11-29T12:00:10Z")));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(reconciles(), before, "heartbeats recomputed");
    cp.ok(&status_apply, Some(&node_status("False", "2026-11-29T12:00:20Z")));
    within(Duration::from_secs(5), "a readiness change recomputes", || {
        if reconciles() > before { Ok(()) } else { Err(format!("still {before}")) }
    })
    .await;

    // A forged report (issue 15): edge-a's own token (a compromised edge-a: a node can only
    // speak for itself), reporting worker-2's underlay address, then one that is no node's. Each
    // is refused, with its reason in the class status and an event, and no node's desired state
    // changes (docs/security.md). edge-a's fake executor stops first: its reconnect would
    // supersede the forger's stream (a newer stream for a node ends the older one).
    edge_task.abort();
    cp.ok(&status_apply, Some(&node_status("True", "2026-11-29T12:00:30Z")));
    quiet(&cp).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let desired_before = desired_versions(&a2, &trust).await;
    assert!(desired_before.len() >= 4, "{desired_before:?}");
    let acks_before = worker.borrow().len();
    for forged in ["100.64.0.12", "100.64.0.66"] {
        let forger = forge(&a2, &trust.ca, &token("edge-a"), "edge-a", forged).await;
        within(Duration::from_secs(10), &format!("underlay {forged} refused"), || {
            let rows = cp.json(&["get", "pmc", "public"])["status"]["nodes"].clone();
            let row =
                rows.as_array().and_then(|r| r.iter().find(|n| n["name"] == "edge-a")).cloned().unwrap_or_default();
            let message = row["message"].as_str().unwrap_or_default().to_string();
            let events = cp.ok(
                &[
                    "get",
                    "events",
                    "-A",
                    "--field-selector",
                    "involvedObject.name=public",
                    "-o",
                    "jsonpath={.items[*].reason}",
                ],
                None,
            );
            if message.contains("UnderlayNotNodeAddress: underlayAddress: ")
                && message.contains(forged)
                && row["underlayAddress"] == "100.64.93.143"
                && events.contains("UnderlayNotNodeAddress")
            {
                Ok(())
            } else {
                Err(format!("row {row}, events {events:?}"))
            }
        })
        .await;
        // Past the pace: a recompute the forged report caused has published by now.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(desired_versions(&a2, &trust).await, desired_before, "{forged}: a node's desired state changed");
        forger.abort();
    }
    assert_eq!(worker.borrow().len(), acks_before, "worker-2 was sent no new state");

    // Teardown, as the chart's pre-delete hook runs it (docs/operations/uninstall.md): every
    // node's state empty, kuportctl waits for the acks; the ConfigMap's deletion (Helm deletes
    // it) changes nothing; a new leader finds the teardown; --undo brings the states back.
    let teardown = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kuport-teardown","namespace":"default"},"data":{"teardown":"false"}}"#;
    cp.ok(&["apply", "-f", "-"], Some(teardown));
    let empty =
        kuport_proto::canonical_version(&kuport_proto::v1::NodeState { node: "worker-2".into(), ..Default::default() });
    let last_acked = || worker.borrow().last().map(|a| a.1.clone()).unwrap_or_default();
    assert_ne!(last_acked(), empty, "worker-2 holds a state before the teardown");
    let ca_file = cp.dir.join("teardown-ca.pem");
    std::fs::write(&ca_file, &trust.ca).expect("the CA file");
    let sources = |controller: &str| kuport_controller::ctl::Sources {
        controller: format!("https://{controller}"),
        ca_file: Some(ca_file.clone()),
        token: Some(trust.debug.clone()),
        namespace: "default".into(),
        kubeconfig: Some(cp.kubeconfig.clone()),
        lease_name: None,
    };
    let started = Instant::now();
    let said = kuport_controller::ctl::teardown(&sources(&a2), false, Duration::from_secs(5), false)
        .await
        .expect("kuportctl teardown");
    println!("teardown with one executor connected: {:?}\n{said}", started.elapsed());
    assert!(said.contains("worker-2: empty, acknowledged"), "{said}");
    assert!(said.contains("edge-a: no executor connected"), "{said}");
    assert_eq!(last_acked(), empty, "worker-2 acknowledged an empty state");
    cp.ok(&["delete", "configmap", "-n", "default", "kuport-teardown"], None);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let desired = desired_versions(&a2, &trust).await;
    let empty_of = |n: &str| {
        kuport_proto::canonical_version(&kuport_proto::v1::NodeState { node: n.into(), ..Default::default() })
    };
    assert!(desired.iter().all(|(n, v)| *v == empty_of(n)), "the ConfigMap's deletion reprogrammed: {desired:?}");
    cp.ok(&["apply", "-f", "-"], Some(&teardown.replace(r#""false""#, r#""true""#)));
    let acks_before = worker.borrow().len();
    c2.signal("-KILL");
    within(Duration::from_secs(15), "c1 leads and worker-2 acks its empty state", || {
        let acks = worker.borrow();
        match acks.get(acks_before..).and_then(|a| a.last()) {
            Some((term, v)) if *term > c1_term && *v == empty && holder(&cp).starts_with("c1@") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(worker.borrow()[acks_before..].iter().all(|a| a.1 == empty), "the new leader sent only empty states");
    let said = kuport_controller::ctl::teardown(&sources(&a1), false, Duration::from_secs(5), true)
        .await
        .expect("kuportctl teardown --undo");
    assert!(said.contains("withdrawn"), "{said}");
    within(Duration::from_secs(10), "worker-2's state comes back", || {
        if last_acked() != empty { Ok(()) } else { Err("still empty".into()) }
    })
    .await;
    drop(c1);
    drop(c2);
}

/// Every node's desired version, as the Debug service of the controller at `address` shows it.
async fn desired_versions(address: &str, trust: &Trust) -> Vec<(String, String)> {
    use kuport_proto::v1::ListNodesRequest;
    use kuport_proto::v1::debug_client::DebugClient;
    let endpoint = kuport_proto::channel::endpoint(&format!("https://{address}"), Some(&trust.ca)).expect("endpoint");
    let mut client = DebugClient::new(endpoint.connect().await.expect("Debug connects"));
    let nodes =
        client.list_nodes(bearer(&trust.debug, ListNodesRequest {})).await.expect("ListNodes").into_inner().nodes;
    nodes.into_iter().map(|n| (n.node, n.desired_version)).collect()
}

/// A stream that says Hello as `node` and reports `underlay` as its underlay address, drained
/// until the returned task is aborted.
async fn forge(
    address: &str,
    ca: &[u8],
    token: &str,
    node: &'static str,
    underlay: &str,
) -> tokio::task::JoinHandle<()> {
    let mut client = node_sync(address, ca).await.expect("NodeSync connects");
    let mut f = facts(node);
    f.underlay_address = underlay.into();
    let (tx, rx) = mpsc::channel(8);
    let hello = Hello { node: node.into(), executor_version: "forged".into(), applied: None };
    tx.send(ExecutorMessage { message: Some(executor_message::Message::Hello(hello)) }).await.expect("hello");
    tx.send(ExecutorMessage { message: Some(executor_message::Message::Facts(f)) }).await.expect("facts");
    let mut inbound = client.sync(bearer(token, ReceiverStream::new(rx))).await.expect("sync").into_inner();
    tokio::spawn(async move {
        let _tx = tx;
        while let Ok(Some(_)) = inbound.message().await {}
    })
}

/// Waits until no PortMap or PortMapClass changed for a second; their resourceVersions then.
async fn quiet(cp: &ControlPlane) -> Vec<(String, String)> {
    let started = Instant::now();
    let mut last = versions(cp);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = versions(cp);
        if now == last {
            return now;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "statuses never settled");
        last = now;
    }
}

/// A second after the current leader's reconnect grace ends, timed from the Lease's acquireTime.
fn grace_end(cp: &ControlPlane) -> Instant {
    let at = cp.ok(&["get", "lease", "-n", "default", "kuport-controller", "-o", "jsonpath={.spec.acquireTime}"], None);
    let acquired: Timestamp = at.trim().parse().unwrap_or_else(|e| panic!("acquireTime {at:?}: {e}"));
    let left = (acquired + RECONNECT_GRACE + Duration::from_secs(1)).duration_since(Timestamp::now());
    Instant::now() + Duration::try_from(left).unwrap_or_default()
}

/// The sum of a controller's kuport_api_writes_total series.
fn api_writes(c: &Controller) -> u64 {
    let m = c.metrics();
    m.lines()
        .filter(|l| l.starts_with("kuport_api_writes_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}
