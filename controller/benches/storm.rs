//! Reconnect-storm benchmark (issue 15): every executor of the fan-out benchmark reconnecting
//! at once, as after a failover, with TLS and TokenReviews against a real API server.
//!
//! Run as root or not, release profile: `cargo bench -p kuport-controller --bench storm`.
//! KUPORT_BENCH_NODES (1000) and KUPORT_BENCH_MAPS (5000) size the cluster (benches/common's
//! synthetic one, as in the fan-out benchmark). Needs the lab's control plane binaries
//! (`bash e2e/controlplane/build.sh`, cached), starts etcd and kube-apiserver in a temporary
//! folder and stops them on exit.
//!
//! Setup, untimed: one Node, one Pod (spec.nodeName) and one pod-bound token (TokenRequest,
//! audience kuport.wlz.li/node-exec, as a kubelet mints it) per node; the hub computes every
//! node's state before a storm starts. Then, side by side in one run, each storm a fresh hub
//! and server (a new leader) unless said otherwise, all executors started at once, each on its
//! own connection, acking its first state at once:
//! - plain h2c, no authentication (the insecure folder mode's port);
//! - TLS, no authentication;
//! - TLS and a TokenReview per executor (cold cache: a new leader);
//! - the same server again, every executor reconnecting at once (warm cache).
//!
//! - a new leader again (cold cache), every executor naming in Hello the state it holds (a
//!   failover with nothing changed: the state goes as stubs).
//!
//! Measured: from the start to the last executor holding its first state and having acked it;
//! the TokenReviews sent (`Executors::reviews_sent`); connection attempts that failed; the bytes
//! of the first states.

/// The controller's allocator (its `main.rs`), so the benchmark measures what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/machine.rs"]
mod machine;
use cluster::*;
use machine::loadavg;

use futures::StreamExt as _;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Container, Namespace, Node, Pod, PodSpec, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use kuport_controller::compute::Settings;
use kuport_controller::serve::{MAX_MESSAGE, Trust, serve_grpc};
use kuport_controller::stream::{Hub, leader};
use kuport_controller::trust::EXECUTOR_AUDIENCE;
use kuport_controller::trust::identity::{Executors, KubeReviewer};
use kuport_controller::trust::tls::{Pem, Tls, issue_ca, issue_serving};
use kuport_proto::channel;
use kuport_proto::v1::node_sync_client::NodeSyncClient;
use kuport_proto::v1::{Ack, Applied, ExecutorMessage, Hello, controller_message, executor_message};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const NAMESPACE: &str = "kuport-system";
const SERVICE_ACCOUNT: &str = "kuport-node-exec";
const STORM_TIMEOUT: Duration = Duration::from_secs(600);

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn script(name: &str, args: &[&std::path::Path]) -> BenchResult<String> {
    let out = std::process::Command::new("bash").arg(repo().join("e2e/controlplane").join(name)).args(args).output()?;
    if !out.status.success() {
        return Err(format!("{name}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().trim().to_string())
}

/// etcd and kube-apiserver in a temporary folder, stopped on drop.
struct ControlPlane(std::path::PathBuf);

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = script("down.sh", &[&self.0]);
    }
}

/// One executor as the storm starts it: its node, its token, and the state it says in Hello it
/// applied (the one before a failover).
type Start = (String, Option<String>, Option<Applied>);

/// What the executors of one storm count together.
#[derive(Default)]
struct Counts {
    failed: AtomicUsize,
    acked: AtomicUsize,
    /// The bytes of every executor's first state.
    bytes: AtomicUsize,
}

/// One executor: connect (its own connection), prove itself, Hello, ack the first state, then
/// keep the stream open until aborted; retried until the ack went out, counting failures.
async fn executor(address: String, ca: Option<Arc<Vec<u8>>>, start: Start, counts: Arc<Counts>) {
    let (node, token, applied) = start;
    loop {
        let e = session(&address, ca.as_deref().map(Vec::as_slice), &node, token.as_deref(), applied.clone(), &counts)
            .await;
        if let Err(e) = e
            && counts.failed.fetch_add(1, Ordering::Relaxed) < 3
        {
            eprintln!("{node}: {e}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn session(
    address: &str,
    ca: Option<&[u8]>,
    node: &str,
    token: Option<&str>,
    applied: Option<Applied>,
    counts: &Counts,
) -> BenchResult<()> {
    let channel = channel::endpoint(address, ca)?.connect().await?;
    let mut client = NodeSyncClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
    let (tx, rx) = mpsc::channel(4);
    let hello = Hello { node: node.to_string(), executor_version: "storm-bench".into(), applied };
    tx.send(ExecutorMessage { message: Some(executor_message::Message::Hello(hello)) }).await?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(t) = token {
        channel::authorize(&mut request, t)?;
    }
    let mut inbound = client.sync(request).await?.into_inner();
    let mut first = true;
    loop {
        let m = inbound.message().await?.ok_or("stream ended")?;
        let Some(controller_message::Message::State(ds)) = m.message else { continue };
        if first {
            counts.bytes.fetch_add(prost::Message::encoded_len(&ds), Ordering::Relaxed);
        }
        let ack = Ack { term: ds.term, sequence: ds.sequence, version: ds.version, ok: true, errors: vec![] };
        tx.send(ExecutorMessage { message: Some(executor_message::Message::Ack(ack)) }).await?;
        if std::mem::take(&mut first) {
            counts.acked.fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Storm {
    label: &'static str,
    took: Duration,
    reviews: Option<u64>,
    failed: usize,
    /// The bytes of the executors' first states.
    bytes: usize,
}

/// Starts every executor at once and waits until each acked its first state; the executors
/// keep their streams until the returned tasks are aborted.
async fn storm(
    label: &'static str,
    address: &str,
    ca: Option<Arc<Vec<u8>>>,
    starts: &[Start],
    executors: Option<&Executors>,
) -> BenchResult<(Storm, Vec<tokio::task::JoinHandle<()>>)> {
    let before = executors.map(Executors::reviews_sent);
    let counts = Arc::new(Counts::default());
    let started = Instant::now();
    let tasks: Vec<_> = starts
        .iter()
        .map(|start| tokio::spawn(executor(address.to_string(), ca.clone(), start.clone(), counts.clone())))
        .collect();
    while counts.acked.load(Ordering::Relaxed) < starts.len() {
        if started.elapsed() > STORM_TIMEOUT {
            return Err(format!("{label}: {} of {} acked", counts.acked.load(Ordering::Relaxed), starts.len()).into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed();
    let reviews = executors.map(Executors::reviews_sent).zip(before).map(|(a, b)| a - b);
    let (failed, bytes) = (counts.failed.load(Ordering::Relaxed), counts.bytes.load(Ordering::Relaxed));
    Ok((Storm { label, took, reviews, failed, bytes }, tasks))
}

/// A new leader: a fresh hub with every node's state computed, serving on a new port.
struct Leader {
    address: String,
    hub: Arc<Hub>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Leader {
    /// A leader over TLS that proves executors by TokenReview, its review cache cold.
    async fn reviewing(
        cluster: &kuport_controller::observe::Cluster,
        client: &kube::Client,
        serving: &Pem,
    ) -> BenchResult<(Self, Arc<Executors>)> {
        let executors = Arc::new(Executors::new(
            Arc::new(KubeReviewer(client.clone())),
            EXECUTOR_AUDIENCE,
            format!("{NAMESPACE}:{SERVICE_ACCOUNT}"),
        ));
        let trust = Trust { tls: Some(Tls::fixed(serving)?), executors: Some(executors.clone()), debug: None };
        Ok((Leader::start(cluster, trust, "https").await?, executors))
    }

    async fn start(cluster: &kuport_controller::observe::Cluster, trust: Trust, scheme: &str) -> BenchResult<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let local = listener.local_addr()?;
        let (lead_tx, lead_rx) = leader::standalone(local.to_string());
        let hub = Hub::new(Settings::default(), lead_rx, true);
        hub.set_inputs(cluster.clone());
        let recompute = hub.clone().recompute_loop(None);
        tokio::spawn(async move {
            // The sender must live as long as the loop: it ends when leadership cannot change.
            let _lead = lead_tx;
            recompute.await
        });
        let started = Instant::now();
        while hub.outputs().0.node_states.len() < cluster.nodes.len() {
            if started.elapsed() > STORM_TIMEOUT {
                return Err("the hub computed no states".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_grpc(hub.clone(), listener, trust, async {
            let _ = stopped.await;
        }));
        Ok(Leader { address: format!("{scheme}://{local}"), hub, stop: Some(stop) })
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.hub.close();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn end(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        t.abort();
    }
}

/// Nodes, Pods and pod-bound tokens, as the kubelet would have them.
async fn tokens(client: &kube::Client, cluster: &kuport_controller::observe::Cluster) -> BenchResult<Vec<String>> {
    let meta = |name: &str| ObjectMeta { name: Some(name.into()), ..Default::default() };
    let pp = PostParams::default();
    Api::<Namespace>::all(client.clone())
        .create(&pp, &Namespace { metadata: meta(NAMESPACE), ..Default::default() })
        .await?;
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE);
    accounts.create(&pp, &ServiceAccount { metadata: meta(SERVICE_ACCOUNT), ..Default::default() }).await?;
    let nodes = Api::<Node>::all(client.clone());
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let minted = futures::stream::iter(cluster.nodes.iter().map(|n| {
        let (nodes, pods, accounts, pp) = (nodes.clone(), pods.clone(), accounts.clone(), pp.clone());
        let node = n.metadata.name.clone().unwrap_or_default();
        async move {
            nodes.create(&pp, &Node { metadata: meta(&node), ..Default::default() }).await?;
            let pod = Pod {
                metadata: meta(&format!("node-exec-{node}")),
                spec: Some(PodSpec {
                    node_name: Some(node.clone()),
                    service_account_name: Some(SERVICE_ACCOUNT.into()),
                    containers: vec![Container {
                        name: "node-exec".into(),
                        image: Some("kuport-node-exec".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            };
            let pod = pods.create(&pp, &pod).await?;
            let request = TokenRequest {
                spec: Some(TokenRequestSpec {
                    audiences: Some(vec![EXECUTOR_AUDIENCE.into()]),
                    expiration_seconds: Some(3600),
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        name: pod.metadata.name.clone(),
                        uid: pod.metadata.uid.clone(),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let t = accounts.create_token_request(SERVICE_ACCOUNT, &pp, &request).await?;
            BenchResult::Ok(t.status.and_then(|s| s.token).unwrap_or_default())
        }
    }))
    .buffered(32)
    .collect::<Vec<_>>()
    .await;
    minted.into_iter().collect()
}

#[tokio::main]
async fn main() -> BenchResult<()> {
    let n_nodes: usize = std::env::var("KUPORT_BENCH_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let n_maps: usize = std::env::var("KUPORT_BENCH_MAPS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    let load_start = loadavg();
    script("build.sh", &[])?;
    let dir = std::env::temp_dir().join(format!("kuport-storm-bench-{}", std::process::id()));
    let kubeconfig = std::path::PathBuf::from(script("up.sh", &[&dir])?);
    let _plane = ControlPlane(dir);
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    let client = kube::Client::try_from(cfg)?;

    let cluster = build(n_nodes, n_maps, &mut Rng(42));
    let t = Instant::now();
    let minted = tokens(&client, &cluster).await?;
    eprintln!("{n_nodes} Nodes, Pods and tokens in {:?}", t.elapsed());
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.metadata.name.clone().unwrap_or_default()).collect();
    let anonymous: Vec<Start> = names.iter().map(|n| (n.clone(), None, None)).collect();
    let proven: Vec<Start> = names.iter().cloned().zip(minted).map(|(n, t)| (n, Some(t), None)).collect();

    let ca = issue_ca()?;
    let serving = issue_serving(&ca)?;
    let ca_pem = Some(Arc::new(ca.cert.clone().into_bytes()));
    let mut storms = Vec::new();

    let plain = Leader::start(&cluster, Trust::default(), "http").await?;
    let (s, tasks) = storm("plain h2c, no authentication", &plain.address, None, &anonymous, None).await?;
    storms.push(s);
    end(tasks);
    drop(plain);

    let tls = Trust { tls: Some(Tls::fixed(&serving)?), ..Default::default() };
    let leader = Leader::start(&cluster, tls, "https").await?;
    let (s, tasks) = storm("TLS, no authentication", &leader.address, ca_pem.clone(), &anonymous, None).await?;
    storms.push(s);
    end(tasks);
    drop(leader);

    let (leader, executors) = Leader::reviewing(&cluster, &client, &serving).await?;
    let label = "TLS and TokenReview, a new leader (cold cache)";
    let (s, tasks) = storm(label, &leader.address, ca_pem.clone(), &proven, Some(&executors)).await?;
    storms.push(s);
    end(tasks);
    // Let the server see every stream end before they come back.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let label = "TLS and TokenReview, the same leader again (warm cache)";
    let (s, tasks) = storm(label, &leader.address, ca_pem.clone(), &proven, Some(&executors)).await?;
    storms.push(s);
    end(tasks);
    // What each executor holds now, which it names in Hello to the next leader.
    let holding: Vec<Start> = proven
        .iter()
        .map(|(n, t, _)| {
            let d = leader.hub.node(n).and_then(|e| e.desired);
            let applied = d.map(|d| Applied { term: d.term, sequence: d.sequence, version: d.version.clone() });
            (n.clone(), t.clone(), applied)
        })
        .collect();
    drop(leader);

    // A failover with nothing changed: a new leader (cold cache), every executor naming the
    // state it holds, which the new leader computed the same (docs/design.md, "Deltas").
    let (leader, executors) = Leader::reviewing(&cluster, &client, &serving).await?;
    let label = "TLS and TokenReview, a new leader (cold cache), executors naming the state they hold";
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (s, tasks) = storm(label, &leader.address, ca_pem.clone(), &holding, Some(&executors)).await?;
    storms.push(s);
    end(tasks);
    drop(leader);

    println!(
        "\n{n_nodes} executors ({n_maps} PortMaps), all reconnecting at once; load average {load_start} at the start, {} at the end\n",
        loadavg()
    );
    println!("| storm | time to all synced | TokenReviews sent | failed attempts | first states, KiB |");
    println!("|---|---|---|---|---|");
    for s in storms {
        let reviews = s.reviews.map_or("-".to_string(), |r| r.to_string());
        let kib = s.bytes as f64 / 1024.0;
        println!("| {} | {:.2} s | {reviews} | {} | {kib:.1} |", s.label, s.took.as_secs_f64(), s.failed);
    }
    Ok(())
}
