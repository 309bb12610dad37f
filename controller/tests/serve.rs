//! The standalone controller's gRPC surface, without executors or root: kuportctl (the
//! binary), the standard health service, reflection (what grpcurl needs), and a folder edit.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kuport_controller::compute::{Settings, compute};
use kuport_controller::render;
use kuport_controller::serve::{Standalone, run_standalone};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster")
}

fn copy_examples(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kuport-serve-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    for e in std::fs::read_dir(examples()).expect("examples") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
    }
    dir
}

/// kuportctl against the folder mode's plain-text port (http://: no CA, no token).
fn kuportctl(address: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kuportctl"))
        .args(["--controller", &format!("http://{address}")])
        .args(args)
        .output()
        .expect("kuportctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kuportctl_health_reflection_and_folder_edits() {
    let dir = copy_examples("ctl");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    let cfg = Standalone { manifests: dir.clone(), settings: Settings::default(), advertise: None };
    let server = tokio::spawn(run_standalone(cfg, listener, async {
        let _ = stopped.await;
    }));

    // kuportctl node: exactly the canonical text of what `render` computes from the folder.
    let want = {
        let cluster = render::load_dir(&dir, k8s_openapi::jiff::Timestamp::now()).expect("load");
        let out = compute(&cluster, &Settings::default());
        kuport_proto::text::node_state(&out.node_states["edge-a"])
    };
    let started = Instant::now();
    let shown = loop {
        let (ok, out, err) = tokio::task::spawn_blocking({
            let a = address.clone();
            move || kuportctl(&a, &["node", "edge-a"])
        })
        .await
        .expect("join");
        if ok {
            break out;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "kuportctl node edge-a: {err}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(shown, want);
    let a = address.clone();
    let (json_ok, json, _) =
        tokio::task::spawn_blocking(move || kuportctl(&a, &["node", "edge-a", "-o", "json"])).await.expect("join");
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert!(json_ok && v["version"].as_str().is_some_and(|s| s.len() == 64), "{json}");
    let a = address.clone();
    let (ok, nodes, _) = tokio::task::spawn_blocking(move || kuportctl(&a, &["nodes"])).await.expect("join");
    assert!(ok && nodes.starts_with("NODE ") && nodes.contains("worker-3") && nodes.contains("absent"), "{nodes}");
    let a = address.clone();
    let (ok, pm, _) =
        tokio::task::spawn_blocking(move || kuportctl(&a, &["portmap", "games/game"])).await.expect("join");
    assert!(ok && pm.contains("node edge-a (accepting): pending") && pm.contains("type: Programmed"), "{pm}");
    let a = address.clone();
    let (ok, _, err) =
        tokio::task::spawn_blocking(move || kuportctl(&a, &["portmap", "games/nope"])).await.expect("join");
    assert!(!ok && err.contains("games/nope"), "a missing PortMap is an error naming it: {err}");

    // The standard health service answers SERVING for the whole server and each service.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "kuport.v1.NodeSync", "kuport.v1.Debug"] {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest { service: service.into() })
            .await
            .unwrap_or_else(|e| panic!("health {service:?}: {e}"))
            .into_inner();
        assert_eq!(r.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32, "{service:?}");
    }

    // Reflection lists kuport's services, so grpcurl needs no .proto files.
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers =
        reflection.server_reflection_info(tokio_stream::iter([request])).await.expect("reflection").into_inner();
    let answer = answers.message().await.expect("answer").expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else { panic!("{answer:?}") };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in ["kuport.v1.NodeSync", "kuport.v1.Debug", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == want), "reflection lists {names:?}");
    }

    // A manifest that does not parse keeps the previous inputs (nothing torn down).
    let before = shown;
    std::fs::write(dir.join("zz-broken.yaml"), "apiVersion: v1\nkind: Node\nmetadata: {name: 7}\nspec: [\n")
        .expect("write");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let a = address.clone();
    let (ok, after, _) = tokio::task::spawn_blocking(move || kuportctl(&a, &["node", "edge-a"])).await.expect("join");
    assert!(ok);
    assert_eq!(after, before, "a broken file changes nothing");
    let a = address.clone();
    let (_, nodes, _) = tokio::task::spawn_blocking(move || kuportctl(&a, &["nodes"])).await.expect("join");
    assert!(
        nodes.contains("# inputs refused") && nodes.contains("zz-broken.yaml"),
        "the refusal names the file: {nodes}"
    );

    let _ = stop.send(());
    server.await.expect("join").expect("server");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The folder mode is plain text and unauthenticated: refused unless it listens on loopback.
#[test]
fn the_insecure_folder_mode_is_refused_off_loopback() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let out = Command::new(env!("CARGO_BIN_EXE_kuport-controller"))
        .args(["run", "--insecure-manifests"])
        .arg(&dir)
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .expect("kuport-controller");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--insecure-manifests") && err.contains("loopback") && err.contains("0.0.0.0:0"), "{err}");
}

/// Set in the child process [`debug_replica_child`] runs in.
const CHILD: &str = "KUPORT_DEBUG_REPLICA_CHILD";

/// A reviewer that refuses every token (no call here should reach it).
struct NoOne;

impl kuport_controller::trust::identity::Reviewer for NoOne {
    fn token_review<'a>(
        &'a self,
        _: &'a str,
        _: &'a [String],
    ) -> futures::future::BoxFuture<
        'a,
        Result<kuport_controller::trust::identity::Reviewed, kuport_controller::trust::identity::ReviewError>,
    > {
        Box::pin(async { Ok(Default::default()) })
    }
    fn access_review<'a>(
        &'a self,
        _: &'a kuport_controller::trust::identity::Reviewed,
        _: &'a kuport_controller::trust::identity::Access,
    ) -> futures::future::BoxFuture<
        'a,
        Result<kuport_controller::trust::identity::Decision, kuport_controller::trust::identity::ReviewError>,
    > {
        Box::pin(async { Ok(kuport_controller::trust::identity::Decision { allowed: false, reason: "no one".into() }) })
    }
}

/// Not a test by itself: the replica of [`oversize_unauthenticated_debug_calls_leave_memory_flat`],
/// in a process of its own so that its memory is its own. It serves Debug as a Kubernetes-mode
/// replica does (every call authorized) and prints its address; it ends when its stdin closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_replica_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    use kuport_controller::stream::{Hub, leader};
    use kuport_controller::trust::access::DebugAccess;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let (_lead, rx) = leader::standalone(address.clone());
    let hub = Hub::new(Settings::default(), rx, true);
    let debug = DebugAccess::new(std::sync::Arc::new(NoOne));
    let trust = kuport_controller::serve::Trust { debug: Some(std::sync::Arc::new(debug)), ..Default::default() };
    let stop = async {
        let _ = tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink())).await;
    };
    println!("listening {address}");
    kuport_controller::serve::serve_grpc(hub, listener, trust, stop).await.expect("serve");
}

/// kB of `field` (VmRSS, VmHWM) in /proc/`pid`/status.
fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse().ok())
        .expect(field)
}

/// Finding 4 (docs/security.md): 50 concurrent 8 MiB Debug calls without a token are refused
/// as unauthenticated from their headers, and the replica's peak memory stays flat. Before,
/// each was read and decoded whole (256 MiB allowed) and only then refused: its peak grew by
/// hundreds of MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_unauthenticated_debug_calls_leave_memory_flat() {
    use kuport_proto::v1::GetNodeRequest;
    use kuport_proto::v1::debug_client::DebugClient;
    use std::io::BufRead;
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args(["--exact", "debug_replica_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("child");
    let pid = child.id();
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let address = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).expect("read") > 0, "the child ended before listening");
        // After the harness's "test debug_replica_child ... " on the same line.
        if let Some((_, a)) = line.trim().split_once("listening ") {
            break a.to_string();
        }
    };
    let mut client = loop {
        if let Ok(c) = DebugClient::connect(format!("http://{address}")).await {
            break c.max_encoding_message_size(64 * 1024 * 1024);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // A small call first: the replica at rest, its buffers warm.
    let small =
        tokio::time::timeout(Duration::from_secs(10), client.get_node(GetNodeRequest { node: "worker-1".into() }))
            .await
            .expect("the small call is answered")
            .unwrap_err();
    assert_eq!(small.code(), tonic::Code::Unauthenticated, "{small:?}");
    let before = status_kb(pid, "VmHWM");
    let big = "x".repeat(8 * 1024 * 1024);
    let calls = (0..50).map(|_| {
        let mut c = client.clone();
        let node = big.clone();
        async move { c.get_node(GetNodeRequest { node }).await }
    });
    let answers =
        tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(calls)).await.expect("answered");
    for a in &answers {
        let status = a.as_ref().expect_err("refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        assert!(status.message().contains("no_token"), "{status:?}");
    }
    let after = status_kb(pid, "VmHWM");
    let rss = status_kb(pid, "VmRSS");
    drop(child.stdin.take());
    let _ = child.wait();
    // 400 MiB were sent; the old code's peak grew by several times 8 MiB at the least.
    assert!(after - before < 16 * 1024, "peak RSS grew from {before} kB to {after} kB (now {rss} kB)");
}
