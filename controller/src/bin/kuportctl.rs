//! kuportctl: asks a kuport controller what it wants each node to be, and what the nodes did.

// Library paths handle input: no unwrap there (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use kuport_controller::ctl::{self, Output};

#[derive(Parser)]
#[command(name = "kuportctl", version, about)]
struct Cli {
    /// The controller's gRPC address (any replica; kubectl port-forward works): https://HOST:PORT,
    /// or http://HOST:PORT for a controller in the insecure folder mode. By default the leader's
    /// address, from the Lease kuport-controller in --namespace (read with the kubeconfig).
    #[arg(long, global = true, env = "KUPORT_CONTROLLER")]
    controller: Option<String>,
    /// The CA bundle (PEM) the controller's certificate is verified against; by default the
    /// kuport-ca ConfigMap in --namespace, read with the kubeconfig.
    #[arg(long, global = true, env = "KUPORT_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// The bearer token the controller checks with the API server (RBAC: the chart's
    /// kuport-debug ClusterRole); by default the kubeconfig user's token. For a kubeconfig
    /// with a client certificate: --token "$(kubectl create token SERVICEACCOUNT -n NAMESPACE)".
    #[arg(long, global = true, env = "KUPORT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The controller's namespace (its kuport-ca ConfigMap).
    #[arg(long, short = 'n', global = true, default_value = "kuport-system")]
    namespace: String,
    /// The kubeconfig; by default $KUBECONFIG or ~/.kube/config.
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The Lease that names the leader, in --namespace (the chart's controller name, which
    /// follows the release's).
    #[arg(long, global = true, env = "KUPORT_LEASE_NAME", default_value = ctl::LEASE_NAME)]
    lease_name: String,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Text)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A node's desired state: nftables as `nft list` prints them, then the ip commands.
    Node { name: String },
    /// Every node: executor connected, desired and acknowledged versions, drift, overlay, last error.
    Nodes,
    /// The overlay as a tree: every member (key fingerprint, endpoint, pod CIDRs, address, peer
    /// count, relay candidate) with its peers under it, each with its route (direct, via RELAY,
    /// unreachable) and its reach, last handshake, bytes and endpoint as the member's executor
    /// reported them; then every refused node with its reasons.
    Mesh,
    /// Why a PortMap is or is not programmed, and where.
    Portmap {
        /// NAMESPACE/NAME
        name: String,
    },
    /// Where a flow stops, hop by hop with live counters: `trace ADDR:PORT[/udp] [--from
    /// CLIENT]` (a published port), `trace pod NS/NAME --to NS/NAME` or `trace node A --to B`
    /// (the mesh path), `trace intercept NS/NAME`. With --watch N, the counters are read again
    /// after N seconds while the client tries, and the first hop that did not count is named.
    Trace {
        /// ADDR:PORT[/udp], or `pod`, `node` or `intercept`
        what: String,
        /// For pod, node and intercept: NS/NAME or the node's name
        name: Option<String>,
        /// The other end of a mesh trace.
        #[arg(long)]
        to: Option<String>,
        /// The client's address: whether the allow-list admits it.
        #[arg(long)]
        from: Option<String>,
        /// Seconds to watch the counters while the client tries (at most 60).
        #[arg(long, default_value_t = 0)]
        watch: u32,
    },
    /// Empties every node's state (ConfigMap kuport-teardown in --namespace), then waits until
    /// every node's executor acknowledged it: nothing of kuport stays in the nodes' kernels.
    /// The chart's pre-delete hook runs it before `helm uninstall`. A node without a connected
    /// executor is waited for, then named.
    Teardown {
        /// Seconds to wait for the nodes.
        #[arg(long, default_value_t = 120)]
        wait: u64,
        /// Withdraws the teardown: the controller computes every node's state again.
        #[arg(long)]
        undo: bool,
    },
}

/// The trace's target from its words: an address, or `pod`/`node` NAME --to OTHER, or
/// `intercept` NS/NAME.
fn trace_target(
    what: &str,
    name: Option<String>,
    to: Option<String>,
    from: Option<String>,
) -> Result<ctl::TraceTarget, ctl::CtlError> {
    let usage = |m: &str| ctl::CtlError::Usage(m.to_string());
    match what {
        "pod" | "node" => {
            let from = name.ok_or_else(|| usage("trace pod NS/NAME --to NS/NAME (or node A --to B)"))?;
            let to = to.ok_or_else(|| usage("a mesh trace needs --to"))?;
            Ok(ctl::TraceTarget::Mesh { from, to, pods: what == "pod" })
        }
        "intercept" => Ok(ctl::TraceTarget::Intercept(name.ok_or_else(|| usage("trace intercept NS/NAME"))?)),
        address => Ok(ctl::TraceTarget::Address { address: address.to_string(), from }),
    }
}

fn main() -> ExitCode {
    // Installed as kubectl-kuport (a link to this binary), kubectl runs it for `kubectl kuport`.
    let plugin = std::env::args_os()
        .next()
        .and_then(|a| PathBuf::from(a).file_name().map(|n| n.to_string_lossy().starts_with("kubectl-kuport")))
        .unwrap_or(false);
    let command = Cli::command();
    let command = if plugin { command.bin_name("kubectl kuport") } else { command };
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: building the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let mut sources = ctl::Sources {
            controller: cli.controller.clone().unwrap_or_default(),
            ca_file: cli.ca_file.clone(),
            token: cli.token.clone(),
            namespace: cli.namespace.clone(),
            kubeconfig: cli.kubeconfig.clone(),
            lease_name: Some(cli.lease_name.clone()),
        };
        if let Command::Teardown { wait, undo } = &cli.command {
            let wait = std::time::Duration::from_secs(*wait);
            return ctl::teardown(&sources, cli.controller.is_none(), wait, *undo).await;
        }
        if cli.controller.is_none() {
            sources.controller = ctl::discover(&sources).await?;
        }
        let credentials = ctl::credentials(&sources).await?;
        let mut client = match ctl::connect_with(&sources.controller, &credentials).await {
            // A pod address is reachable from the cluster's network, rarely from a laptop.
            Err(ctl::CtlError::Connect { address, reason }) if cli.controller.is_none() => {
                return Err(ctl::CtlError::Connect {
                    address,
                    reason: format!(
                        "{reason} (the leader's address, from its Lease {}/{}; from outside the cluster's network: \
                         kubectl port-forward -n {} service/kuport-controller 9443, then --controller https://127.0.0.1:9443)",
                        cli.namespace,
                        cli.lease_name,
                        cli.namespace
                    ),
                });
            }
            other => other?,
        };
        match &cli.command {
            Command::Node { name } => ctl::node(&mut client, name, cli.output).await,
            Command::Nodes => ctl::nodes(&mut client, cli.output).await,
            Command::Mesh => ctl::mesh(&mut client, cli.output).await,
            Command::Portmap { name } => ctl::port_map(&mut client, name, cli.output).await,
            Command::Trace { what, name, to, from, watch } => {
                let target = trace_target(what, name.clone(), to.clone(), from.clone())?;
                ctl::trace(&mut client, target, *watch, cli.output).await
            }
            Command::Teardown { .. } => Err(ctl::CtlError::Usage("teardown runs before connecting".into())),
        }
    });
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
