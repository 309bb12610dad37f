//! Trust against a real kube-apiserver and etcd (e2e/controlplane): executors prove their node
//! with a Pod-bound ServiceAccount token (TokenReview), over TLS with the CA the controller
//! publishes; every other credential is refused with its reason logged and counted, and
//! receives no state. kuportctl is authorized by RBAC on the leader and on a follower.
//! docs/security.md.

mod common;
use common::{ControlPlane, Controller, bearer, free_address, node_sync, repo, within};

use std::process::Command;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kuport_controller::report::status::RECONNECT_GRACE;
use kuport_controller::trust::EXECUTOR_AUDIENCE;
use kuport_proto::v1::{ExecutorMessage, Hello, controller_message, executor_message};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const NS: &str = "kuport-system";
/// Handshake failures are logged at debug.
const LOG_LEVEL: &str = "info,kube=warn,kuport_controller::trust::tls=debug";

/// Opens a NodeSync stream (Hello for `node`) with `token`; Ok(the first message) or the status.
async fn sync(
    address: &str,
    ca: &[u8],
    token: Option<&str>,
    node: &str,
) -> Result<controller_message::Message, tonic::Status> {
    let mut client = node_sync(address, ca).await.map_err(tonic::Status::unavailable)?;
    let (tx, rx) = mpsc::channel(8);
    let hello = Hello { node: node.into(), executor_version: "test".into(), applied: None };
    tx.send(ExecutorMessage { message: Some(executor_message::Message::Hello(hello)) }).await.expect("hello");
    let request = match token {
        Some(t) => bearer(t, ReceiverStream::new(rx)),
        None => tonic::Request::new(ReceiverStream::new(rx)),
    };
    let mut inbound = client.sync(request).await?.into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), inbound.message())
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("no first message"))??;
    first.and_then(|m| m.message).ok_or_else(|| tonic::Status::aborted("the stream ended"))
}

fn b64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn b64url_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => continue,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    out
}

/// `token`'s claims with iat/nbf/exp an hour or two in the past, signed RS256 with the control
/// plane's service-account key: a genuine token, expired.
fn expired(cp: &ControlPlane, token: &str) -> String {
    let mut parts = token.split('.');
    let (header, payload) = (parts.next().expect("header"), parts.next().expect("payload"));
    let mut claims: serde_json::Value = serde_json::from_slice(&b64url_decode(payload)).expect("claims");
    let now = Timestamp::now().as_second();
    claims["iat"] = (now - 7200).into();
    claims["nbf"] = (now - 7200).into();
    claims["exp"] = (now - 3600).into();
    let signed = format!("{header}.{}", b64url(claims.to_string().as_bytes()));
    let input = cp.dir.join("expired.jwt");
    std::fs::write(&input, &signed).expect("write");
    let sig = Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(cp.dir.join("pki/sa.key"))
        .arg(&input)
        .output()
        .expect("openssl");
    assert!(sig.status.success(), "openssl: {}", String::from_utf8_lossy(&sig.stderr));
    format!("{signed}.{}", b64url(&sig.stdout))
}

/// resourceVersion of every PortMap and PortMapClass: unchanged means nothing was written.
fn versions(cp: &ControlPlane) -> Vec<String> {
    let mut out = Vec::new();
    for kind in ["pm", "pmc"] {
        let list = cp.json(&["get", kind, "-A"]);
        for o in list["items"].as_array().into_iter().flatten() {
            let m = &o["metadata"];
            out.push(format!("{kind} {} {} {}", m["namespace"], m["name"], m["resourceVersion"]));
        }
    }
    out.sort();
    out
}

fn kuportctl(cp: &ControlPlane, address: &str, token: Option<&str>) -> Result<String, String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kuportctl"));
    cmd.args(["--controller", &format!("https://{address}"), "-n", NS, "--kubeconfig"]).arg(&cp.kubeconfig);
    if let Some(t) = token {
        cmd.args(["--token", t]);
    }
    let out = cmd.arg("nodes").env_remove("KUPORT_TOKEN").output().expect("kuportctl");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn executors_prove_their_node_and_debug_needs_rbac() {
    tokio::time::timeout(Duration::from_secs(240), scenario()).await.expect("the test hung");
}

async fn scenario() {
    let cp = ControlPlane::up("trust");
    let examples = repo().join("examples/cluster");
    cp.apply_file(&repo().join("crds/kuport.wlz.li.yaml"));
    cp.established(&["crd/portmaps.kuport.wlz.li"]);
    for f in ["classes", "nodes", "web", "game"] {
        cp.apply_file(&examples.join(format!("{f}.yaml")));
    }
    cp.ok(&["create", "namespace", NS], None);
    cp.executor_pods(NS, &["worker-1", "worker-2"]);

    let (a1, a2) = (free_address(), free_address());
    let c1 = Controller::start(&cp, "c1", &a1, NS, &[], LOG_LEVEL);
    let ca = cp.ca(NS);
    within(Duration::from_secs(20), "c1 leads", || {
        if c1.counter("kuport_leader") == 1 { Ok(()) } else { Err("not yet".into()) }
    })
    .await;
    let c2 = Controller::start(&cp, "c2", &a2, NS, &[], LOG_LEVEL);

    // worker-1 with its own token: its state comes down.
    let w1 = cp.executor_token(NS, "worker-1");
    let first = sync(&a1, &ca, Some(&w1), "worker-1").await.expect("worker-1 syncs");
    assert!(matches!(first, controller_message::Message::State(_)), "{first:?}");
    // Keep one worker-1 stream open, as its executor would.
    let (keep_tx, keep_rx) = mpsc::channel(8);
    let hello = Hello { node: "worker-1".into(), executor_version: "test".into(), applied: None };
    keep_tx.send(ExecutorMessage { message: Some(executor_message::Message::Hello(hello)) }).await.expect("hello");
    let mut keeper = node_sync(&a1, &ca).await.expect("connects");
    let _kept = keeper.sync(bearer(&w1, ReceiverStream::new(keep_rx))).await.expect("worker-1 stream");

    // Let the statuses settle past the leader's reconnect grace: a refusal must change none.
    tokio::time::sleep(RECONNECT_GRACE + Duration::from_secs(2)).await;
    let mut before = versions(&cp);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = versions(&cp);
        if now == before {
            break;
        }
        before = now;
    }

    // Every other credential, refused with its reason.
    cp.ok(&["create", "serviceaccount", "-n", NS, "intruder"], None);
    let intruder_pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: intruder, namespace: kuport-system}\n\
        spec: {nodeName: worker-2, serviceAccountName: intruder, containers: [{name: c, image: x}]}\n";
    cp.ok(&["apply", "-f", "-"], Some(intruder_pod));
    let other_sa = cp.bound_token(NS, "intruder", "intruder", EXECUTOR_AUDIENCE);
    let other_audience = cp.bound_token(NS, "kuport-node-exec", "node-exec-worker-2", "https://kubernetes.default.svc");
    let stale = expired(&cp, &cp.executor_token(NS, "worker-2"));
    let gone_pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: node-exec-gone, namespace: kuport-system}\n\
        spec: {nodeName: worker-2, serviceAccountName: kuport-node-exec, containers: [{name: c, image: x}]}\n";
    cp.ok(&["apply", "-f", "-"], Some(gone_pod));
    let gone = cp.bound_token(NS, "kuport-node-exec", "node-exec-gone", EXECUTOR_AUDIENCE);
    cp.ok(&["delete", "pod", "-n", NS, "node-exec-gone", "--grace-period=0", "--force"], None);

    let cases: Vec<(&str, Option<&str>, &str, tonic::Code)> = vec![
        ("worker-1's token for worker-2", Some(&w1), "wrong_node", tonic::Code::PermissionDenied),
        ("another ServiceAccount", Some(&other_sa), "wrong_service_account", tonic::Code::PermissionDenied),
        ("another audience", Some(&other_audience), "wrong_audience", tonic::Code::Unauthenticated),
        ("an expired token", Some(&stale), "invalid_token", tonic::Code::Unauthenticated),
        ("a deleted Pod's token", Some(&gone), "invalid_token", tonic::Code::Unauthenticated),
        ("no token", None, "no_token", tonic::Code::Unauthenticated),
    ];
    for (what, token, reason, code) in &cases {
        let before = c1.counter(&format!("kuport_executor_refusals_total{{reason=\"{reason}\"}}"));
        let refused = sync(&a1, &ca, *token, "worker-2").await.expect_err(what);
        assert_eq!(refused.code(), *code, "{what}: {refused:?}");
        assert!(refused.message().starts_with(reason), "{what}: {refused:?}");
        let after = c1.counter(&format!("kuport_executor_refusals_total{{reason=\"{reason}\"}}"));
        assert!(after > before, "{what}: counted ({before} then {after})");
        assert!(c1.log().lines().any(|l| l.contains("executor refused") && l.contains(reason)), "{what}: logged");
    }
    let wrong_node = c1.log();
    let line = wrong_node.lines().find(|l| l.contains("wrong_node")).expect("the wrong_node line");
    assert!(line.contains("claimed=\"worker-2\"") || line.contains("claimed=worker-2"), "{line}");
    assert!(line.contains("proven=\"worker-1\"") || line.contains("proven=worker-1"), "{line}");
    // One review per token: worker-1's served its three streams from the cache.
    assert_eq!(c1.counter("kuport_token_reviews_total"), 5, "{}", c1.metrics());

    // A plain-text client: the TLS handshake refuses it (logged and counted); no stream.
    let plain = async {
        let mut client = kuport_proto::v1::node_sync_client::NodeSyncClient::connect(format!("http://{a1}"))
            .await
            .map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::channel(8);
        let hello = Hello { node: "worker-2".into(), executor_version: "plain".into(), applied: None };
        let _ = tx.send(ExecutorMessage { message: Some(executor_message::Message::Hello(hello)) }).await;
        client.sync(bearer(&w1, ReceiverStream::new(rx))).await.map(|_| ()).map_err(|e| e.to_string())
    };
    let plain = tokio::time::timeout(Duration::from_secs(15), plain).await.expect("the plain client is answered");
    assert!(plain.is_err(), "a plain-text client must not get a stream");
    within(Duration::from_secs(5), "the handshake failure logged", || {
        if c1.log().contains("TLS handshake failed") { Ok(()) } else { Err("no line".into()) }
    })
    .await;
    assert!(c1.counter("kuport_tls_refusals_total") >= 1, "{}", c1.metrics());

    // None of them received state, connected worker-2 or changed a status.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(versions(&cp), before, "a refused stream changed a status");

    // kuportctl: refused without the RBAC permission, allowed with it, on the leader and the
    // follower; a client-certificate kubeconfig is told how to get a token.
    let nobody = cp.debug_token(NS, "nobody", false);
    let err = kuportctl(&cp, &a1, Some(&nobody)).expect_err("no permission");
    assert!(err.contains("PermissionDenied") && err.contains("may not list nodestates"), "{err}");
    let err = kuportctl(&cp, &a2, Some(&nobody)).expect_err("no permission on the follower");
    assert!(err.contains("PermissionDenied"), "{err}");
    assert!(c2.counter("kuport_debug_refusals_total{reason=\"forbidden\"}") >= 1, "{}", c2.metrics());
    let err = kuportctl(&cp, &a1, None).expect_err("a client certificate is no token");
    assert!(err.contains("kubectl create token"), "{err}");
    let debugger = cp.debug_token(NS, "debugger", true);
    let leader = kuportctl(&cp, &a1, Some(&debugger)).expect("kuportctl on the leader");
    let row = leader.lines().find(|l| l.starts_with("worker-1")).unwrap_or_default().to_string();
    assert!(row.contains("connected"), "{leader}");
    let w2 = leader.lines().find(|l| l.starts_with("worker-2")).unwrap_or_default().to_string();
    assert!(w2.is_empty() || w2.contains("absent"), "worker-2 never connected: {leader}");
    let follower = kuportctl(&cp, &a2, Some(&debugger)).expect("kuportctl on the follower");
    assert!(follower.contains("not the leader"), "{follower}");

    // `kubectl kuport nodes`: kubectl runs kuportctl installed as kubectl-kuport, which finds the
    // leader from the kubeconfig alone (its Lease), with no --controller.
    let plugins = cp.dir.join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin folder");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kuportctl"), plugins.join("kubectl-kuport")).expect("link");
    let path = format!("{}:{}", plugins.display(), std::env::var("PATH").unwrap_or_default());
    let plugin = |args: &[&str]| {
        let out = Command::new(&cp.kubectl)
            .arg("kuport")
            .args(args)
            .env("PATH", &path)
            .env("KUBECONFIG", &cp.kubeconfig)
            .env_remove("KUPORT_CONTROLLER")
            .env_remove("KUPORT_TOKEN")
            .output()
            .expect("kubectl kuport");
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (found, err) = plugin(&["nodes", "-n", NS, "--token", &debugger]);
    let row = found.lines().find(|l| l.starts_with("worker-1")).unwrap_or_default();
    assert!(row.contains("connected") && !found.contains("not the leader"), "the leader answers: {found}{err}");
    let (help, err) = plugin(&["--help"]);
    assert!(help.contains("Usage: kubectl kuport"), "{help}{err}");
    // Without kuport in the namespace it says what it looked for.
    let (_, err) = plugin(&["nodes", "-n", "default", "--token", &debugger]);
    assert!(err.contains("no Lease default/kuport-controller") && err.contains("--controller"), "{err}");
    drop(c2);
    drop(c1);
    // Killed, the leader leaves its Lease behind: the plugin says where it looked and what to
    // do from outside the cluster's network.
    let (_, err) = plugin(&["nodes", "-n", NS, "--token", &debugger]);
    assert!(err.contains(&a1) && err.contains("from its Lease") && err.contains("kubectl port-forward"), "{err}");
}
