//! The executor's side of trust against a fake TLS controller (no root needed): it verifies the
//! controller with its CA file under the fixed server name, sends its token as a Bearer header,
//! and re-reads both files at every connect; a bad configuration is refused at start; the
//! node's WireGuard public key goes up in its facts while the private key stays on disk.

use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use kuport_controller::trust::tls::{Tls, issue_ca, issue_serving};
use kuport_node_exec::sync::{Config, NodeApplier, run};
use kuport_proto::v1::node_sync_server::{NodeSync, NodeSyncServer};
use kuport_proto::v1::{ControllerMessage, ExecutorMessage, NodeState, ObjectError, executor_message};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

/// Records each stream's authorization header and Hello node, then ends the stream at once
/// (so the executor reconnects).
struct Fake {
    seen: mpsc::UnboundedSender<(String, String)>,
}

#[tonic::async_trait]
impl NodeSync for Fake {
    type SyncStream = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

    async fn sync(&self, request: Request<Streaming<ExecutorMessage>>) -> Result<Response<Self::SyncStream>, Status> {
        let auth = request.metadata().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let mut inbound = request.into_inner();
        let node = match inbound.message().await {
            Ok(Some(ExecutorMessage { message: Some(executor_message::Message::Hello(h)) })) => h.node,
            _ => String::new(),
        };
        let _ = self.seen.send((auth, node));
        Ok(Response::new(Box::pin(tokio_stream::empty::<Result<ControllerMessage, Status>>())))
    }
}

struct Nothing;

impl NodeApplier for Nothing {
    async fn apply(&mut self, _: NodeState) -> Result<(), Vec<ObjectError>> {
        Ok(())
    }

    fn drift(&self) -> (u64, Vec<String>) {
        (0, Vec::new())
    }
}

fn dir(label: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kuport-sync-tls-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

async fn controller(tls: &Tls) -> (String, mpsc::UnboundedReceiver<(String, String)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (seen, rx) = mpsc::unbounded_channel();
    let incoming = tls.incoming(listener, Default::default());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(NodeSyncServer::new(Fake { seen }))
            .serve_with_incoming(incoming),
    );
    (format!("https://{address}"), rx)
}

async fn next(seen: &mut mpsc::UnboundedReceiver<(String, String)>) -> (String, String) {
    tokio::time::timeout(Duration::from_secs(5), seen.recv()).await.expect("a stream in time").expect("open")
}

fn config(address: &str, dir: &std::path::Path) -> Config {
    let mut cfg = Config::new(address, "n1");
    cfg.ca_file = Some(dir.join("ca.crt"));
    cfg.token_file = Some(dir.join("token"));
    cfg.backoff_initial = Duration::from_millis(20);
    cfg.backoff_max = Duration::from_millis(100);
    cfg
}

#[tokio::test]
async fn the_token_and_the_ca_are_read_at_every_connect() {
    let ca = issue_ca().unwrap();
    let tls = Tls::fixed(&issue_serving(&ca).unwrap()).unwrap();
    let (address, mut seen) = controller(&tls).await;
    let d = dir("rotate");
    std::fs::write(d.join("ca.crt"), &ca.cert).unwrap();
    std::fs::write(d.join("token"), "first.token\n").unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let exec = tokio::spawn(run(config(&address, &d), Nothing, async {
        let _ = stop_rx.await;
    }));
    assert_eq!(next(&mut seen).await, ("Bearer first.token".to_string(), "n1".to_string()));

    // The kubelet rotates the token: the next connect sends the new one.
    std::fs::write(d.join("token"), "second.token").unwrap();
    let mut got = next(&mut seen).await;
    while got.0 == "Bearer first.token" {
        got = next(&mut seen).await;
    }
    assert_eq!(got.0, "Bearer second.token");

    // A CA file that no longer names the controller's CA: no stream gets through.
    std::fs::write(d.join("ca.crt"), issue_ca().unwrap().cert).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    while seen.try_recv().is_ok() {}
    assert!(tokio::time::timeout(Duration::from_secs(1), seen.recv()).await.is_err(), "connected with another CA");
    // Put back, it connects again.
    std::fs::write(d.join("ca.crt"), &ca.cert).unwrap();
    assert_eq!(next(&mut seen).await.0, "Bearer second.token");

    let _ = stop_tx.send(());
    exec.await.unwrap();
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_configuration_that_cannot_work_is_refused_at_start() {
    let e = Config::new("https://10.0.0.1:9443", "n1").check().unwrap_err().to_string();
    assert!(e.contains("--ca-file"), "{e}");
    let e = Config::new("10.0.0.1:9443", "n1").check().unwrap_err().to_string();
    assert!(e.contains("https://HOST:PORT") && e.contains("http://HOST:PORT"), "{e}");
    let mut ok = Config::new("https://a:1, https://b:1", "n1");
    ok.ca_file = Some("/nonexistent/yet".into());
    ok.check().unwrap();
    Config::new("http://127.0.0.1:9443", "n1").check().unwrap();
}

/// Records the WireGuard public key of each stream's first facts.
struct FactsFake {
    keys: mpsc::UnboundedSender<String>,
}

#[tonic::async_trait]
impl NodeSync for FactsFake {
    type SyncStream = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

    async fn sync(&self, request: Request<Streaming<ExecutorMessage>>) -> Result<Response<Self::SyncStream>, Status> {
        // Answered at once, as the controller does: the executor sends facts once the stream is up.
        let mut inbound = request.into_inner();
        let keys = self.keys.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                if let Some(executor_message::Message::Facts(f)) = m.message {
                    let _ = keys.send(f.wireguard_public_key);
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::pending::<Result<ControllerMessage, Status>>())))
    }
}

/// The executor makes the node's WireGuard key in its state directory on first start and
/// reports only the public key, the one `wg pubkey` derives from the file (the oracle); a
/// restart reports the same.
#[tokio::test]
async fn the_public_key_is_reported_and_the_private_key_stays_in_the_state_directory() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let (keys, mut reported) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(NodeSyncServer::new(FactsFake { keys }))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let d = dir("wgkey");
    let mut first = None;
    for _ in 0..2 {
        let mut cfg = Config::new(address.clone(), "n1");
        cfg.state_dir = Some(d.clone());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let exec = tokio::spawn(run(cfg, Nothing, async {
            let _ = stop_rx.await;
        }));
        let key = tokio::time::timeout(Duration::from_secs(10), reported.recv()).await.expect("facts").expect("open");
        let _ = stop_tx.send(());
        exec.await.unwrap();
        let private = std::fs::read(d.join("wireguard.key")).expect("the key file");
        let mut wg = std::process::Command::new("wg")
            .arg("pubkey")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("wg (wireguard-tools)");
        std::io::Write::write_all(&mut wg.stdin.take().unwrap(), &private).unwrap();
        let oracle = String::from_utf8(wg.wait_with_output().unwrap().stdout).unwrap();
        assert_eq!(key, oracle.trim(), "the reported key is the file's public key");
        assert!(!String::from_utf8_lossy(&private).contains(&key), "the file holds the private key, not the public");
        assert_eq!(*first.get_or_insert_with(|| key.clone()), key, "a restart reports the same key");
    }
    let _ = std::fs::remove_dir_all(&d);
}
