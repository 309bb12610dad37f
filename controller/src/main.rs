//! kuport-controller: computes every node's desired network state.

// Library paths handle input: no unwrap there (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use k8s_openapi::jiff::Timestamp;
use kuport_controller::api::crds;
use kuport_controller::compute::{Settings, compute, overlay};
use kuport_controller::{render, serve};

/// mimalloc, as the executor: a compute makes and drops millions of small objects, and glibc's
/// malloc spent half its time on them (docs/decisions.md, "The controller allocates with
/// mimalloc"). The benchmarks declare it too, so they measure what runs here.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    network: NetworkArgs,
}

/// The node network settings. None describes the CNI: the executors report what the port maps
/// need of it (docs/portmap/datapath.md, "The request claim").
#[derive(clap::Args)]
struct NetworkArgs {
    /// Join the nodes with kuport's WireGuard mesh (docs/overlay/mesh.md): the CNI must then
    /// not route pod CIDRs between nodes itself.
    #[arg(long, global = true, env = "KUPORT_OVERLAY")]
    overlay: bool,
    /// The overlay's device on every node; under kuport's link prefix `kup-`.
    #[arg(long, global = true, env = "KUPORT_OVERLAY_INTERFACE", default_value = overlay::DEFAULT_INTERFACE)]
    overlay_interface: String,
    /// The UDP port every overlay device listens on.
    #[arg(long, global = true, env = "KUPORT_OVERLAY_PORT", default_value_t = overlay::DEFAULT_LISTEN_PORT)]
    overlay_port: u16,
}

impl NetworkArgs {
    fn settings(&self) -> anyhow::Result<Settings> {
        let overlay = match self.overlay {
            true => Some(overlay::OverlaySettings::new(&self.overlay_interface, self.overlay_port)?),
            false => None,
        };
        Ok(Settings { overlay })
    }
}

#[derive(Subcommand)]
enum Command {
    /// Reads a folder of manifests and prints every node's desired state and every status.
    Render {
        /// Folder of YAML: Nodes, Namespaces, Services, EndpointSlices, PortMapClasses,
        /// PortMaps and optional NodeFacts.
        dir: PathBuf,
        /// The time statuses are stamped with (RFC 3339); now by default.
        #[arg(long)]
        now: Option<Timestamp>,
    },
    /// Prints the CustomResourceDefinitions (crds/ holds this output).
    Crds,
    /// Runs the controller: computes every node's state and streams it to the executors.
    Run(Box<RunArgs>),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Read the inputs from this folder of manifests (watched for changes) instead of the
    /// Kubernetes API. Insecure: plain text, no authentication; refused unless --listen is a
    /// loopback address.
    #[arg(long, value_name = "DIR")]
    insecure_manifests: Option<PathBuf>,
    /// The gRPC address: NodeSync, Debug, health and reflection.
    #[arg(long, default_value = "0.0.0.0:9443")]
    listen: String,
    /// The address executors are sent to when this replica leads (host:port); by default
    /// the --listen address.
    #[arg(long, env = "KUPORT_ADVERTISE")]
    advertise: Option<String>,
    /// The Lease's namespace (Kubernetes source).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kuport-system")]
    lease_namespace: String,
    /// The Lease the replicas elect a leader on.
    #[arg(long, default_value = "kuport-controller")]
    lease_name: String,
    /// This replica's name, unique among replicas (the pod name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// The folder of a mounted kubernetes.io/tls Secret (tls.crt, tls.key) to serve with; by
    /// default the controller manages its own CA and certificate in Secret kuport-controller-tls
    /// of the Lease's namespace.
    #[arg(long, env = "KUPORT_TLS_DIR", value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// The audience executors' projected ServiceAccount tokens must be for.
    #[arg(long, default_value = kuport_controller::trust::EXECUTOR_AUDIENCE)]
    executor_audience: String,
    /// The executors' ServiceAccount as NAMESPACE:NAME; by default kuport-node-exec in the
    /// Lease's namespace.
    #[arg(long, value_name = "NS:NAME")]
    executor_service_account: Option<String>,
    /// Where Prometheus metrics are served (/metrics; Kubernetes source only). Empty: nowhere.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_listen: String,
    /// error, warn, info, debug or trace (or a tracing filter).
    #[arg(long, env = "KUPORT_LOG_LEVEL", default_value = "info")]
    log_level: String,
    #[arg(long, env = "KUPORT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Render { dir, now } => {
            let cluster = render::load_dir(&dir, now.unwrap_or_else(Timestamp::now))
                .with_context(|| format!("reading {}", dir.display()))?;
            print!("{}", render::render_text(&compute(&cluster, &cli.network.settings()?)));
            Ok(())
        }
        Command::Crds => {
            print!("{}", crds::yaml()?);
            Ok(())
        }
        Command::Run(args) => run_controller(*args, cli.network.settings()?),
    }
}

fn run_controller(args: RunArgs, settings: Settings) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .with_context(|| format!("--log-level {:?}", args.log_level))?;
    // Colours only on a terminal: a log file or collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("building the runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("--listen {}: cannot bind", args.listen))?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        match args.insecure_manifests {
            Some(manifests) => {
                let bound = listener.local_addr().context("the --listen address")?;
                if !bound.ip().is_loopback() {
                    anyhow::bail!(
                        "--insecure-manifests serves plain text without authentication, so only on a loopback \
                         address: --listen {} is not one (use --listen 127.0.0.1:9443, or the Kubernetes source)",
                        args.listen
                    );
                }
                let cfg = serve::Standalone { manifests, settings, advertise: args.advertise };
                serve::run_standalone(cfg, listener, stop).await
            }
            None => {
                let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
                let advertise = args.advertise.unwrap_or_else(|| args.listen.clone());
                let identity = args.identity.unwrap_or_else(|| format!("kuport-{}", std::process::id()));
                let metrics = match args.metrics_listen.as_str() {
                    "" => None,
                    a => Some(
                        tokio::net::TcpListener::bind(a)
                            .await
                            .with_context(|| format!("--metrics-listen {a}: cannot bind"))?,
                    ),
                };
                let executor_service_account = match args.executor_service_account {
                    Some(sa) if sa.split_once(':').is_some_and(|(ns, n)| !ns.is_empty() && !n.is_empty()) => sa,
                    Some(sa) => anyhow::bail!("--executor-service-account {sa:?}: expected NAMESPACE:NAME"),
                    None => format!("{}:kuport-node-exec", args.lease_namespace),
                };
                let cfg = serve::Kubernetes {
                    metrics,
                    tls_dir: args.tls_dir,
                    executor_audience: args.executor_audience,
                    executor_service_account,
                    settings,
                    lease_namespace: args.lease_namespace,
                    lease_name: args.lease_name,
                    identity,
                    advertise,
                };
                serve::run_kubernetes(cfg, client, listener, stop).await
            }
        }
    })
}
