//! kuportctl: asks a kuport controller what it wants each node to be, and what the nodes did.

// Library paths handle input: no unwrap there (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kuport_controller::ctl::{self, Output};

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// The controller's gRPC address (any replica; kubectl port-forward works).
    #[arg(long, global = true, env = "KUPORT_CONTROLLER", default_value = "http://127.0.0.1:9443")]
    controller: String,
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
    /// Every node: executor connected, desired and acknowledged versions, drift, last error.
    Nodes,
    /// Why a PortMap is or is not programmed, and where.
    Portmap {
        /// NAMESPACE/NAME
        name: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: building the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let mut client = ctl::connect(&cli.controller).await?;
        match &cli.command {
            Command::Node { name } => ctl::node(&mut client, name, cli.output).await,
            Command::Nodes => ctl::nodes(&mut client, cli.output).await,
            Command::Portmap { name } => ctl::port_map(&mut client, name, cli.output).await,
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
