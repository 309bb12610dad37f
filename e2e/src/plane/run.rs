//! The hidden subcommands `kuport-lab controller`, `kuport-lab node-exec` and `kuport-lab
//! kubelet`: what runs inside the plane's processes.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::apiserver;

/// Logs to stderr (the process log) at `KUPORT_LOG_LEVEL`, info by default.
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KUPORT_LOG_LEVEL")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_writer(std::io::stderr).try_init();
}

/// The runtime of a plane process, with two worker threads.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("building the runtime")
}

/// Resolves on SIGTERM or Ctrl-C.
async fn terminated() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Where a lab controller reads its inputs.
pub enum ControllerSource {
    /// A manifest folder, watched.
    Folder(PathBuf),
    /// The API server in this kubeconfig; `identity` names the replica in the Lease.
    Kubernetes { kubeconfig: PathBuf, identity: String },
}

/// `kuport-lab controller`: kuport's controller (standalone on a folder, or a replica on the
/// API server) serving on `listen`; prints `listening ADDR` once bound, and for a replica
/// `metrics ADDR` on the same line (/metrics on a free port of 127.0.0.1). Until SIGTERM.
pub fn run_controller(
    source: ControllerSource,
    listen: &str,
    settings: kuport_controller::compute::Settings,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    init_logs();
    let rt = runtime()?;
    rt.block_on(async move {
        let listener =
            tokio::net::TcpListener::bind(listen).await.with_context(|| format!("--listen {listen}: cannot bind"))?;
        let address = listener.local_addr()?;
        let metrics = match source {
            ControllerSource::Folder(_) => None,
            ControllerSource::Kubernetes { .. } => Some(tokio::net::TcpListener::bind("127.0.0.1:0").await?),
        };
        let mut out = std::io::stdout();
        match &metrics {
            Some(m) => writeln!(out, "listening {address} metrics {}", m.local_addr()?)?,
            None => writeln!(out, "listening {address}")?,
        }
        out.flush()?;
        match source {
            ControllerSource::Folder(manifests) => {
                let cfg = kuport_controller::serve::Standalone { manifests, settings, advertise: None };
                kuport_controller::serve::run_standalone(cfg, listener, terminated()).await
            }
            ControllerSource::Kubernetes { kubeconfig, identity } => {
                let client = apiserver::client(&kubeconfig).await?;
                let cfg = kuport_controller::serve::Kubernetes {
                    metrics,
                    settings,
                    lease_namespace: apiserver::LEASE_NAMESPACE.into(),
                    lease_name: apiserver::LEASE_NAME.into(),
                    identity,
                    advertise: address.to_string(),
                    // The managed CA in the Lease's namespace, as the chart's default.
                    tls_dir: None,
                    executor_audience: super::trust::EXECUTOR_AUDIENCE.into(),
                    executor_service_account: super::trust::executor_service_account(),
                };
                kuport_controller::serve::run_kubernetes(cfg, client, listener, terminated()).await
            }
        }
    })
}

/// `kuport-lab node-exec`: kuport's executor (NodeSync client and keepers) for one node.
/// Until SIGTERM; the applied state stays in place.
pub fn run_executor(cfg: kuport_node_exec::sync::Config) -> anyhow::Result<()> {
    init_logs();
    let rt = runtime()?;
    rt.block_on(async move {
        let keepers = kuport_node_exec::sync::NodeKeepers::new(cfg.netns.clone());
        kuport_node_exec::sync::run(cfg, keepers, terminated()).await;
        tracing::info!("stopping; the applied state stays in place");
    });
    Ok(())
}

/// `kuport-lab kubelet`: refreshes the executors' tokens ([`super::trust::run_kubelet`]) until
/// SIGTERM.
pub fn run_kubelet(kubeconfig: PathBuf, tokens: Vec<(String, PathBuf)>) -> anyhow::Result<()> {
    init_logs();
    let rt = runtime()?;
    rt.block_on(async move {
        tokio::select! {
            r = super::trust::run_kubelet(kubeconfig, tokens) => r,
            _ = terminated() => Ok(()),
        }
    })
}
