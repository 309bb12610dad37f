//! The controller at run time, its stages wired together: a source observes (the folder or
//! the API) and feeds the [`Hub`], whose paced recompute streams states to the executors;
//! the status writer, the Debug service and the metrics report.
//!
//! One gRPC port serves NodeSync (leader only), Debug (every replica), the standard health
//! service and reflection, so grpcurl works without .proto files. Against the Kubernetes API it
//! is TLS, executors prove their node and Debug calls are authorized by RBAC ([`Trust`]); the
//! folder mode is plain text and unauthenticated (docs/security.md).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use kuport_proto::v1::debug_server::DebugServer;
use kuport_proto::v1::node_sync_server::NodeSyncServer;
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;

use crate::compute::Settings;
use crate::observe;
use crate::report::{debug, metrics, status};
use crate::stream::hub::{self, Hub};
use crate::stream::{leader, sync};
use crate::trust::access::DebugAccess;
use crate::trust::identity::{Executors, KubeReviewer, Reviewer};
use crate::trust::tls::{self, Tls};

/// The largest answer Debug sends (a node's state among them; states themselves are bounded by
/// [`kuport_proto::channel::MAX_STATE_MESSAGE`]).
pub const MAX_MESSAGE: usize = 256 * 1024 * 1024;
/// The largest request Debug, health and reflection decode, all before any authorization: the
/// largest legitimate one is an ExplainPortMap naming a 63-byte namespace and a 253-byte name
/// (322 bytes encoded; reflection's symbol names are shorter), so 4 KiB leaves room and an
/// unauthenticated caller makes a replica buffer KiB, not MiB (docs/security.md).
pub const MAX_DEBUG_REQUEST: usize = 4 * 1024;
/// The largest message an executor may send (facts, acks, drift): 4 MiB holds the largest
/// report the bounds admit (1,024 interfaces of 64 addresses: 1,138,842 bytes) with room to spare;
/// only states going down need [`MAX_MESSAGE`] (docs/security.md).
pub const MAX_EXECUTOR_MESSAGE: usize = 4 * 1024 * 1024;

/// A controller that reads a manifest folder instead of the Kubernetes API.
pub struct Standalone {
    pub manifests: PathBuf,
    pub settings: Settings,
    /// The address executors are sent to (host:port); the listener's by default.
    pub advertise: Option<String>,
}

/// What guards the gRPC port; all None (the default) is the insecure folder mode: plain text,
/// every Hello believed, every Debug call answered.
#[derive(Clone, Default)]
pub struct Trust {
    /// TLS on the port; None: plain text (h2c).
    pub tls: Option<Tls>,
    /// Executors prove their node before Hello is read.
    pub executors: Option<Arc<Executors>>,
    /// Debug calls need the caller's RBAC permission.
    pub debug: Option<Arc<DebugAccess>>,
}

/// Serves the hub's services on `listener` until `stop` completes.
pub async fn serve_grpc<F>(
    hub: Arc<Hub>,
    listener: TcpListener,
    trust: Trust,
    stop: F,
) -> Result<(), tonic::transport::Error>
where
    F: std::future::Future<Output = ()> + Send,
{
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<NodeSyncServer<sync::SyncService>>().await;
    health.set_serving::<DebugServer<debug::DebugService>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(kuport_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| {
            tracing::error!(error = %e, "reflection");
            e
        });
    let closer = hub.clone();
    let stop = async move {
        stop.await;
        // Streams never end by themselves; a graceful shutdown waits for them.
        closer.close();
    };
    let mut router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .add_service(health_service.max_decoding_message_size(MAX_DEBUG_REQUEST))
        .add_service(
            NodeSyncServer::new(sync::SyncService::new(hub.clone(), trust.executors))
                .max_decoding_message_size(MAX_EXECUTOR_MESSAGE)
                .max_encoding_message_size(kuport_proto::channel::MAX_STATE_MESSAGE),
        )
        .add_service(InterceptedService::new(
            DebugServer::new(debug::DebugService::new(hub.clone(), trust.debug.clone()))
                .max_decoding_message_size(MAX_DEBUG_REQUEST)
                .max_encoding_message_size(MAX_MESSAGE),
            token_first(trust.debug.is_some(), hub.clone()),
        ));
    if let Ok(r) = reflection {
        router = router.add_service(r.max_decoding_message_size(MAX_DEBUG_REQUEST));
    }
    let tls_refused = hub.metrics().tls_refusals.clone();
    match trust.tls {
        // TCP_NODELAY there too.
        Some(tls) => router.serve_with_incoming_shutdown(tls.incoming(listener, tls_refused), stop).await,
        None => {
            // TCP_NODELAY as tonic's own bind sets it: with Nagle, the tail of a state waits for
            // the executor's delayed ACK (40 ms on Linux).
            let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            router.serve_with_incoming_shutdown(incoming, stop).await
        }
    }
}

/// Refuses a Debug call without a bearer token from its headers alone, before its body is read
/// (the handler then authorizes the token by RBAC); `required` false: the folder mode.
fn token_first(required: bool, hub: Arc<Hub>) -> impl tonic::service::Interceptor + Clone {
    move |request: tonic::Request<()>| {
        if required && let Err(refusal) = crate::trust::identity::bearer(request.metadata()) {
            hub.metrics().debug_refused(refusal.reason);
            tracing::info!(reason = refusal.reason, detail = %refusal.detail, "debug call refused before its body");
            return Err(refusal.into());
        }
        Ok(request)
    }
}

/// Runs a standalone controller on `listener`: the folder source, the recompute loop and the
/// gRPC services, until `stop` completes.
pub async fn run_standalone<F>(cfg: Standalone, listener: TcpListener, stop: F) -> anyhow::Result<()>
where
    F: std::future::Future<Output = ()> + Send,
{
    let address: SocketAddr = listener.local_addr()?;
    let (_lead_tx, lead_rx) = leader::standalone(cfg.advertise.unwrap_or_else(|| address.to_string()));
    let hub = Hub::new(cfg.settings, lead_rx, true);
    let source = tokio::spawn(observe::folder::watch(cfg.manifests, hub.clone()));
    let recompute = tokio::spawn(hub.clone().recompute_loop(None));
    tracing::info!(%address, "serving NodeSync, Debug, health and reflection");
    let served = serve_grpc(hub, listener, Trust::default(), stop).await;
    source.abort();
    recompute.abort();
    served.map_err(Into::into)
}

/// A controller that reads the Kubernetes API and elects a leader on a Lease.
pub struct Kubernetes {
    pub settings: Settings,
    pub lease_namespace: String,
    pub lease_name: String,
    /// This replica's name (the pod's), unique among replicas.
    pub identity: String,
    /// host:port executors reach this replica's NodeSync at.
    pub advertise: String,
    /// Where /metrics is served; None: nowhere.
    pub metrics: Option<TcpListener>,
    /// The operator's mounted kubernetes.io/tls Secret; None: the managed Secret
    /// [`crate::trust::TLS_SECRET`] in `lease_namespace`.
    pub tls_dir: Option<PathBuf>,
    /// The audience of the executors' tokens ([`crate::trust::EXECUTOR_AUDIENCE`]).
    pub executor_audience: String,
    /// The executors' ServiceAccount, "ns:name".
    pub executor_service_account: String,
}

/// Runs a controller replica against the Kubernetes API until `stop` completes; on stop it
/// releases the lease first, so a follower takes over at once.
pub async fn run_kubernetes<F>(
    cfg: Kubernetes,
    client: ::kube::Client,
    listener: TcpListener,
    stop: F,
) -> anyhow::Result<()>
where
    F: std::future::Future<Output = ()> + Send,
{
    let (lead_rx, release) =
        leader::kubernetes(client.clone(), &cfg.lease_namespace, &cfg.lease_name, &cfg.identity, &cfg.advertise)
            .await
            .map_err(|e| anyhow::anyhow!("lease {}/{}: {e}", cfg.lease_namespace, cfg.lease_name))?;
    let hub = Hub::new(cfg.settings, lead_rx, false);
    let source = match cfg.tls_dir {
        Some(dir) => tls::Source::Mounted(dir),
        None => tls::Source::Managed { client: client.clone(), namespace: cfg.lease_namespace.clone() },
    };
    let tls = Tls::start(source).await.map_err(|e| anyhow::anyhow!("the serving certificate: {e}"))?;
    hub.metrics().watch_certificate(tls.clone());
    let reviewer: Arc<dyn Reviewer> = Arc::new(KubeReviewer(client.clone()));
    let executors = Executors::new(reviewer.clone(), cfg.executor_audience, cfg.executor_service_account)
        .counting(hub.metrics().token_reviews.clone());
    let debug = DebugAccess::new(reviewer).counting(hub.metrics().debug_reviews.clone());
    let trust = Trust { tls: Some(tls), executors: Some(Arc::new(executors)), debug: Some(Arc::new(debug)) };
    let stores = observe::kubernetes::watch(&client, &cfg.lease_namespace, hub.clone());
    let writer = status::Writer::new(client, stores, hub.clone(), Some(cfg.identity.clone()));
    let gate: Arc<dyn hub::Gate> = writer.clone();
    let recompute = tokio::spawn(hub.clone().recompute_loop(Some(gate)));
    let statuses = tokio::spawn(writer.run());
    let metrics = cfg.metrics.map(|l| tokio::spawn(metrics::serve(l, hub.clone())));
    let counters = tokio::spawn(hub.clone().counter_loop());
    tracing::info!(address = %cfg.advertise, identity = %cfg.identity, "serving; electing a leader");
    let stop = async move {
        stop.await;
        let (done_tx, done) = tokio::sync::oneshot::channel();
        if release.send(done_tx).is_ok() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), done).await;
        }
    };
    let served = serve_grpc(hub, listener, trust, stop).await;
    recompute.abort();
    statuses.abort();
    counters.abort();
    if let Some(m) = metrics {
        m.abort();
    }
    served.map_err(Into::into)
}
