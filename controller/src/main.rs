//! kuport-controller: computes every node's desired network state.

// Library paths handle input: no unwrap there (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use k8s_openapi::jiff::Timestamp;
use kuport_controller::api::crds;
use kuport_controller::compute::{Settings, compute};
use kuport_controller::{render, serve};

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    cni: CniArgs,
}

/// The CNI kuport runs beside; the defaults are Cilium's device names.
#[derive(clap::Args)]
struct CniArgs {
    /// The device through which the host reaches local pods.
    #[arg(long, global = true, env = "KUPORT_CNI_HOST_DEVICE", default_value = "cilium_host")]
    cni_host_device: String,
    /// Matches every CNI device.
    #[arg(long, global = true, env = "KUPORT_CNI_DEVICES", default_value = "cilium_*")]
    cni_devices: String,
    /// Matches the host side of pods' interfaces.
    #[arg(long, global = true, env = "KUPORT_CNI_POD_DEVICES", default_value = "lxc*")]
    cni_pod_devices: String,
    /// The CNI's VXLAN port, which kuport's links never use.
    #[arg(long, global = true, env = "KUPORT_CNI_VXLAN_PORT", default_value_t = 8472)]
    cni_vxlan_port: u16,
}

impl CniArgs {
    fn settings(&self) -> Settings {
        Settings {
            cni_host_device: self.cni_host_device.clone(),
            cni_device_wildcard: self.cni_devices.clone(),
            cni_pod_device_wildcard: self.cni_pod_devices.clone(),
            cni_vxlan_port: self.cni_vxlan_port,
        }
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
    Run(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Read the inputs from this folder of manifests (watched for changes) instead of the
    /// Kubernetes API.
    #[arg(long)]
    manifests: Option<PathBuf>,
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
            print!("{}", render::render_text(&compute(&cluster, &cli.cni.settings())));
            Ok(())
        }
        Command::Crds => {
            print!("{}", crds::yaml()?);
            Ok(())
        }
        Command::Run(args) => run_controller(args, cli.cni.settings()),
    }
}

fn run_controller(args: RunArgs, settings: Settings) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .with_context(|| format!("--log-level {:?}", args.log_level))?;
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
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
        match args.manifests {
            Some(manifests) => {
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
                let cfg = serve::Kubernetes {
                    metrics,
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
