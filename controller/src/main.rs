//! kuport-controller: computes every node's desired network state.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use k8s_openapi::jiff::Timestamp;
use kuport_controller::compute::{Settings, compute};
use kuport_controller::render;

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
        Command::Render { dir, now } => {
            let cluster = render::load_dir(&dir, now.unwrap_or_else(Timestamp::now))
                .with_context(|| format!("reading {}", dir.display()))?;
            print!("{}", render::render_text(&compute(&cluster, &Settings::default())));
            Ok(())
        }
    }
}
