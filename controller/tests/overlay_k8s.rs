//! The overlay against a real kube-apiserver and etcd (e2e/controlplane): the controller binary
//! with `--overlay`, executors that prove their node (bound tokens over TLS) and report their
//! WireGuard keys. Members' Nodes get the two published annotations; a node without pod CIDRs is
//! refused, visibly (kuportctl nodes and mesh, a Warning event on its Node), and the others stay
//! peers. docs/overlay/mesh.md.

mod common;
use common::{ControlPlane, Controller, bearer, free_address, node_sync, repo, within};

use std::process::Command;
use std::time::Duration;

use kuport_controller::compute::overlay::{
    ENDPOINT_ANNOTATION, KEY_HELD_LABEL, PUBLIC_KEY_ANNOTATION, key_tag, reason,
};
use kuport_proto::v1::{ExecutorMessage, Hello, NodeFacts, executor_message};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const NS: &str = "kuport-system";

/// 32 bytes of `b`, in canonical base64.
fn key(b: u8) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = [b; 32];
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out.push('=');
    out
}

fn kuportctl(cp: &ControlPlane, address: &str, token: &str, command: &str) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_kuportctl"))
        .args(["--controller", &format!("https://{address}"), "-n", NS, "--kubeconfig"])
        .arg(&cp.kubeconfig)
        .args(["--token", token, command])
        .env_remove("KUPORT_TOKEN")
        .output()
        .expect("kuportctl");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A Node `name` at `ip`, with `pod_cidr` when given.
fn node_yaml(name: &str, ip: &str, pod_cidr: Option<&str>) -> String {
    let spec = pod_cidr.map_or(String::new(), |c| format!("spec: {{podCIDR: {c}, podCIDRs: [{c}]}}\n"));
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n{spec}\
         status: {{addresses: [{{type: InternalIP, address: {ip}}}], conditions: [{{type: Ready, status: 'True'}}]}}\n"
    )
}

/// An executor's stream for `node`: Hello, then its facts with `public_key`; kept open while
/// the sender lives.
async fn executor(
    address: &str,
    ca: &[u8],
    token: &str,
    node: &str,
    public_key: &str,
) -> mpsc::Sender<ExecutorMessage> {
    let (tx, rx) = mpsc::channel(8);
    let hello = Hello { node: node.into(), executor_version: "test".into(), applied: None };
    tx.send(ExecutorMessage { message: Some(executor_message::Message::Hello(hello)) }).await.expect("hello");
    let facts = NodeFacts { wireguard_public_key: public_key.into(), ..Default::default() };
    tx.send(ExecutorMessage { message: Some(executor_message::Message::Facts(facts)) }).await.expect("facts");
    let mut client = node_sync(address, ca).await.expect("connects");
    let mut inbound = client.sync(bearer(token, ReceiverStream::new(rx))).await.expect("a stream").into_inner();
    // Drain what comes down, as an executor would read it.
    tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} });
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_get_their_annotations_and_a_refused_node_is_visible() {
    tokio::time::timeout(Duration::from_secs(240), scenario()).await.expect("the test hung");
}

async fn scenario() {
    let cp = ControlPlane::up("overlay");
    cp.apply_file(&repo().join("crds/kuport.wlz.li.yaml"));
    cp.established(&["crd/portmaps.kuport.wlz.li"]);
    let nodes = [
        ("n1", "192.0.2.1", Some("10.42.1.0/24")),
        ("n2", "192.0.2.2", Some("10.42.2.0/24")),
        ("n3", "192.0.2.3", None),
    ];
    for (name, ip, cidr) in nodes {
        let yaml = node_yaml(name, ip, cidr);
        cp.ok(&["apply", "-f", "-"], Some(&yaml));
        cp.ok(&["apply", "--server-side", "--subresource=status", "-f", "-"], Some(&yaml));
    }
    cp.ok(&["create", "namespace", NS], None);
    cp.executor_pods(NS, &["n1", "n2", "n3"]);

    let address = free_address();
    let _controller = Controller::start(&cp, "c1", &address, NS, &["--overlay"], "info,kube=warn");
    let ca = cp.ca(NS);
    let mut streams = Vec::new();
    for (i, (name, _, _)) in nodes.iter().enumerate() {
        let token = cp.executor_token(NS, name);
        let seed = u8::try_from(i + 1).expect("small");
        streams.push(executor(&address, &ca, &token, name, &key(seed)).await);
    }

    // The members' Nodes carry their key and the endpoint peers dial; the refused one neither.
    let annotations = |node: &str| {
        let n = cp.json(&["get", "node", node]);
        n["metadata"]["annotations"].as_object().cloned().unwrap_or_default()
    };
    within(Duration::from_secs(60), "the members' annotations", || {
        for (name, ip, seed) in [("n1", "192.0.2.1", 1), ("n2", "192.0.2.2", 2)] {
            let a = annotations(name);
            let want = (Some(key(seed)), Some(format!("{ip}:51820")));
            let got = (
                a.get(PUBLIC_KEY_ANNOTATION).and_then(|v| v.as_str()).map(str::to_string),
                a.get(ENDPOINT_ANNOTATION).and_then(|v| v.as_str()).map(str::to_string),
            );
            if got != want {
                return Err(format!("{name}: {a:?}"));
            }
        }
        Ok(())
    })
    .await;
    let n3 = annotations("n3");
    assert!(!n3.contains_key(PUBLIC_KEY_ANNOTATION) && !n3.contains_key(ENDPOINT_ANNOTATION), "{n3:?}");
    // Each member's Node holds its key: the label no kubelet can write (docs/overlay/mesh.md).
    let held =
        |node: &str| cp.json(&["get", "node", node])["metadata"]["labels"][KEY_HELD_LABEL].as_str().map(str::to_string);
    within(Duration::from_secs(30), "the members' key labels", || {
        let got = (held("n1"), held("n2"));
        if got == (Some(key_tag(&key(1))), Some(key_tag(&key(2)))) { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;
    assert_eq!(held("n3"), None, "n3 is no member");

    // kuportctl: nodes shows each node's place, mesh the members and why n3 is not one.
    let debugger = cp.debug_token(NS, "debugger", true);
    let mut mesh = String::new();
    within(Duration::from_secs(30), "kuportctl mesh", || {
        mesh = kuportctl(&cp, &address, &debugger, "mesh")?;
        let row = |n: &str| mesh.lines().find(|l| l.starts_with(&format!("{n} "))).unwrap_or_default().to_string();
        let (r1, r2, r3) = (row("n1"), row("n2"), row("n3"));
        let ok = r1.contains(&key(1)[..8])
            && r1.contains("192.0.2.1:51820")
            && r1.contains("10.42.1.0/24")
            && r1.trim_end().ends_with(" 1")
            && r2.contains(&key(2)[..8])
            && r2.trim_end().ends_with(" 1")
            && r3.contains(reason::NO_POD_CIDRS)
            && r3.contains("spec.podCIDRs");
        if ok { Ok(()) } else { Err(mesh.clone()) }
    })
    .await;
    let nodes = kuportctl(&cp, &address, &debugger, "nodes").expect("kuportctl nodes");
    let row = |n: &str| nodes.lines().find(|l| l.starts_with(&format!("{n} "))).unwrap_or_default().to_string();
    assert!(row("n1").contains(" member ") && row("n2").contains(" member "), "{nodes}");
    assert!(row("n3").contains(&format!("refused: {}", reason::NO_POD_CIDRS)), "{nodes}");

    // One Warning event on n3's Node naming the reason.
    within(Duration::from_secs(30), "a Warning event on Node n3", || {
        let events = cp.json(&["get", "events.events.k8s.io", "-A"]);
        let found = events["items"].as_array().into_iter().flatten().any(|e| {
            e["regarding"]["kind"] == "Node"
                && e["regarding"]["name"] == "n3"
                && e["type"] == "Warning"
                && e["reason"] == reason::NO_POD_CIDRS
        });
        if found { Ok(()) } else { Err(format!("{events}")) }
    })
    .await;
    drop(streams);
}
