//! kuport-node-exec: makes a node's kernel match its desired network state. `run` streams the
//! state from the controller and keeps it; `apply` and `keep` take it from a JSON file (for
//! debugging and the lab).

// Library paths handle input: no unwrap there (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kuport_node_exec::executor::Executor;
use kuport_node_exec::podns::{self, Held};
use kuport_node_exec::sync;
use kuport_proto::v1::{NetnsState, NodeState, netns_ref};

/// mimalloc, not glibc's malloc: a 50,000-mapping state is about a million allocations, and
/// after glibc freed one (on the executor's dropper thread) the next apply's first allocations
/// sorted its free lists, 20 to 45 ms of a 2 ms one-mapping change (docs/decisions.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "kuport-node-exec", about = "Makes this node's kernel match its kuport state")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct Target {
    /// A NodeState as JSON.
    #[arg(long)]
    state: PathBuf,
    /// Apply the host entry inside this namespace instead, e.g. /var/run/netns/NAME.
    #[arg(long)]
    netns: Option<PathBuf>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// The controller's NodeSync address (https://HOST:PORT, or http:// for a folder-mode
    /// controller on loopback), or several separated by commas (tried in turn).
    #[arg(long, env = "KUPORT_CONTROLLER")]
    controller: String,
    /// This node's Kubernetes name.
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// Apply the node's (host) entry inside this namespace, e.g. /var/run/netns/NAME.
    #[arg(long)]
    netns: Option<PathBuf>,
    /// Where the last applied state is kept, so a restart keeps it before reconnecting.
    #[arg(long, default_value = "/var/lib/kuport")]
    state_dir: PathBuf,
    /// The interface other nodes reach this one through; by default the default route's.
    #[arg(long)]
    underlay_interface: Option<String>,
    /// The CA bundle (PEM) the controller's certificate is verified against; needed for
    /// https:// addresses. Re-read at every connect.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// The ServiceAccount token (a projected volume's file) sent as `authorization: Bearer`;
    /// re-read at every connect.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The container runtime's CRI socket, asked first for a pod's network namespace
    /// (docs/intercept/table.md); "none" finds pods by address only. By default the first of
    /// /run/containerd/containerd.sock and /var/run/crio/crio.sock that exists.
    #[arg(long, env = "KUPORT_CRI_SOCKET")]
    cri_socket: Option<String>,
    #[command(flatten)]
    log: LogArgs,
}

#[derive(clap::Args)]
struct LogArgs {
    /// error, warn, info, debug or trace (or a tracing filter such as kuport_node_exec=debug).
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

impl LogArgs {
    fn init(&self) -> anyhow::Result<()> {
        let filter = tracing_subscriber::EnvFilter::try_new(&self.log_level)
            .with_context(|| format!("--log-level {:?}", self.log_level))?;
        // Colours only on a terminal: a pod's log (the kubelet keeps stderr verbatim) or a file
        // gets plain text.
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
        match self.log_format {
            LogFormat::Text => builder.init(),
            LogFormat::Json => builder.json().init(),
        }
        Ok(())
    }
}

#[derive(Subcommand)]
enum Command {
    /// Streams this node's state from the controller, applies it and keeps it (repairing
    /// drift), also while the controller is away. Nothing is torn down on exit.
    Run(RunArgs),
    /// Applies every namespace entry once and prints what was written.
    Apply(Target),
    /// Applies, then keeps the state (repairing drift) until SIGTERM or Ctrl-C. Nothing is
    /// torn down on exit.
    Keep(Target),
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
    match Cli::parse().command {
        Command::Apply(t) => {
            let mut failed = 0;
            for (mut ex, state) in entries(&t)? {
                let label = state.describe();
                match ex.apply(&state) {
                    Ok(report) => println!("netns {label}: {report}"),
                    Err(e) => {
                        failed += 1;
                        eprintln!("netns {label}: {e}");
                    }
                }
            }
            anyhow::ensure!(failed == 0, "{failed} namespace(s) refused");
            Ok(())
        }
        Command::Keep(t) => keep(entries(&t)?),
        Command::Run(args) => run_sync(args),
    }
}

/// The state's namespace entries, each with an executor for its namespace (a file or a pod's is
/// found and held open).
fn entries(t: &Target) -> anyhow::Result<Vec<(Executor, NetnsState)>> {
    let text = std::fs::read_to_string(&t.state).with_context(|| format!("reading {}", t.state.display()))?;
    let state: NodeState = serde_json::from_str(&text).with_context(|| format!("parsing {}", t.state.display()))?;
    let host = podns::host_ids(t.netns.as_deref());
    state
        .netns
        .into_iter()
        .map(|ns| {
            let ex = match ns.target.as_ref().and_then(|r| r.kind.as_ref()) {
                None => Executor::new(t.netns.clone()),
                Some(netns_ref::Kind::Path(p)) if p.is_empty() => Executor::new(t.netns.clone()),
                Some(netns_ref::Kind::Path(p)) => Executor::held(Held::open(p.as_ref())?),
                Some(netns_ref::Kind::Pod(pod)) => {
                    let held = podns::resolve_with(pod, &host, podns::cri::default_socket().as_deref())?;
                    let owners = held.owners().clone();
                    return Ok((Executor::held(held), owners.apply(&ns)?));
                }
            };
            Ok((ex, ns))
        })
        .collect::<Result<_, podns::PodnsError>>()
        .context("finding the state's network namespaces")
}

fn keep(entries: Vec<(Executor, NetnsState)>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("building the runtime")?;
    rt.block_on(async move {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let loops = entries.into_iter().map(|(mut ex, state)| {
            let mut stop = stop_rx.clone();
            async move {
                let label = state.describe();
                let stats = ex.stats();
                let result =
                    ex.keep(&state, async move { while stop.changed().await.is_ok() && !*stop.borrow() {} }).await;
                let s = stats.get();
                eprintln!(
                    "netns {label}: {} apply(s), {} drift repair(s), last error: {}",
                    s.applies,
                    s.drift_repairs,
                    s.last_error.as_deref().unwrap_or("none")
                );
                result.map_err(|e| anyhow::anyhow!("netns {label}: {e}"))
            }
        });
        let all = futures::future::join_all(loops);
        tokio::pin!(all);
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        let results = tokio::select! {
            r = &mut all => r,
            _ = term.recv() => { let _ = stop_tx.send(true); all.await }
            _ = tokio::signal::ctrl_c() => { let _ = stop_tx.send(true); all.await }
        };
        results.into_iter().collect::<anyhow::Result<Vec<()>>>().map(|_| ())
    })
}

fn run_sync(args: RunArgs) -> anyhow::Result<()> {
    args.log.init()?;
    let mut cfg = sync::Config::new(args.controller, args.node);
    cfg.netns = args.netns;
    cfg.state_dir = Some(args.state_dir);
    cfg.underlay_interface = args.underlay_interface;
    cfg.ca_file = args.ca_file;
    cfg.token_file = args.token_file;
    cfg.check()?;
    let cri = match args.cri_socket.as_deref() {
        Some("none") => None,
        Some(path) => Some(PathBuf::from(path)),
        None => podns::cri::default_socket(),
    };
    tracing::info!(cri = ?cri, "pods' namespaces: asked of the runtime at this socket first, else found by address");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("building the runtime")?;
    rt.block_on(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        let keepers = sync::NodeKeepers::new(cfg.netns.clone()).with_cri(cri);
        sync::run(cfg, keepers, stop).await;
        tracing::info!("stopping; the applied state stays in place");
        Ok(())
    })
}
