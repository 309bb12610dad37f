//! kuport-lab: a simulated cluster in network namespaces, programmed by kuport.
//!
//! `up` builds a topology and programs it; `apply` programs other manifests; `probe` dials from
//! a host and shows what the pod saw; `exec` runs a command in a host's namespace; `status`
//! shows the lab; `down` removes every namespace, process and file the lab made.

use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use clap::{Parser, Subcommand};
use kuport_controller::compute::Outputs;
use kuport_lab::lab::{Lab, LabOptions, Record, ServerMode};
use kuport_lab::topology::{Ports, Protocol, Topology};
use kuport_lab::{Manifests, echo, program, sys};

#[derive(Parser)]
#[command(name = "kuport-lab", about = "A simulated cluster in network namespaces, programmed by kuport")]
struct Cli {
    /// Where the lab keeps its record, logs and last results.
    #[arg(long, global = true, env = "KUPORT_LAB_DIR", default_value = "/run/kuport-lab")]
    state_dir: PathBuf,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Builds the topology, programs the manifests and probes each published mapping.
    Up {
        /// A topology file; the shipped default (e2e/topologies/default.yaml) when absent.
        #[arg(long)]
        topology: Option<PathBuf>,
        /// A folder of PortMapClasses and PortMaps; the shipped e2e/manifests/default/ when absent.
        #[arg(long)]
        manifests: Option<PathBuf>,
    },
    /// Programs the lab for the manifests in DIR (replacing the previous ones).
    Apply { dir: PathBuf },
    /// Runs a command inside a host's namespace.
    Exec {
        host: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Dials ADDR:PORT from a host; prints what the pod saw and where the reply came from.
    Probe {
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: SocketAddrV4,
        #[arg(long)]
        udp: bool,
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
    },
    /// Shows the lab's hosts, servers and the last PortMap statuses.
    Status,
    /// Removes every namespace, process and file the lab made.
    Down,
    /// Prints the Kubernetes objects and NodeFacts the topology stands for, as
    /// `kuport-controller render` reads them.
    Objects {
        #[arg(long)]
        topology: Option<PathBuf>,
    },
    /// Runs a pod's echo server (started by `up`).
    #[command(hide = true)]
    Serve {
        #[arg(long)]
        netns: PathBuf,
        #[arg(long)]
        pod: String,
        #[arg(long, value_delimiter = ',')]
        tcp: Vec<Ports>,
        #[arg(long, value_delimiter = ',')]
        udp: Vec<Ports>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // The chain of contexts, skipping a cause its parent's message already quotes.
            let mut text = e.to_string();
            for cause in e.chain().skip(1) {
                let c = cause.to_string();
                if !text.contains(&c) {
                    text = format!("{text}: {c}");
                }
            }
            eprintln!("error: {text}");
            ExitCode::FAILURE
        }
    }
}

const RECORD: &str = "lab.json";
const PORTMAPS: &str = "portmaps.txt";
const RENDER: &str = "render.txt";

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let dir = cli.state_dir;
    match cli.command {
        Cmd::Up { topology, manifests } => up(&dir, topology.as_deref(), manifests.as_deref()),
        Cmd::Apply { dir: m } => {
            let mut lab = Lab::attach(load_record(&dir)?);
            let manifests = Manifests::from_dir(&m)?;
            let result = program(&mut lab, &manifests);
            save(&dir, &lab, result.as_ref().ok())?;
            let out = result?;
            print!("{}", summary(&out));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Exec { host, cmd } => {
            use std::os::unix::process::CommandExt as _;
            let lab = Lab::attach(load_record(&dir)?);
            lab.netns(&host)?;
            let err =
                std::process::Command::new("ip").args(["netns", "exec", &lab.netns_name(&host)]).args(&cmd).exec();
            Err(anyhow!("ip netns exec: {err}"))
        }
        Cmd::Probe { from, to, udp, timeout_ms } => {
            let lab = Lab::attach(load_record(&dir)?);
            let proto = if udp { Protocol::Udp } else { Protocol::Tcp };
            match lab.probe_with(&from, to, proto, Duration::from_millis(timeout_ms)) {
                Ok(a) => {
                    println!("{from} -> {a}");
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    println!("{from} -> {to}/{proto}: {e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Cmd::Status => status(&dir),
        Cmd::Down => down(&dir),
        Cmd::Objects { topology } => {
            let t = match topology {
                Some(p) => Topology::load(&p)?,
                None => Topology::default_lab(),
            };
            print!("{}", kuport_lab::objects::generate(&t).to_yaml());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Serve { netns, pod, tcp, udp } => serve(&netns, &pod, &tcp, &udp),
    }
}

fn load_record(dir: &Path) -> anyhow::Result<Record> {
    let path = dir.join(RECORD);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("no lab at {} (kuport-lab up makes one)", dir.display()))?;
    serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))
}

fn save(dir: &Path, lab: &Lab, out: Option<&Outputs>) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(&lab.record())?;
    let tmp = dir.join(format!("{RECORD}.tmp"));
    std::fs::write(&tmp, json).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(RECORD))?;
    if let Some(out) = out {
        std::fs::write(dir.join(PORTMAPS), summary(out))?;
        std::fs::write(dir.join(RENDER), kuport_controller::render::render_text(out))?;
    }
    Ok(())
}

/// One line per PortMap: its Programmed condition, endpoint and published addresses.
fn summary(out: &Outputs) -> String {
    let mut s = String::new();
    for ((ns, name), st) in &out.port_maps {
        let cond = |t: &str| st.conditions.iter().find(|c| c.type_ == t);
        let programmed = cond("Programmed")
            .map(|c| {
                format!(
                    "Programmed={} {}{}",
                    c.status,
                    c.reason,
                    if c.message.is_empty() { String::new() } else { format!(": {}", c.message) }
                )
            })
            .unwrap_or_else(|| "Programmed=?".into());
        let endpoint =
            st.endpoint.as_ref().map(|e| format!("{} on {}", e.address, e.node)).unwrap_or_else(|| "-".into());
        let published: Vec<String> =
            st.published.iter().map(|p| format!("{} {} {}", p.node, p.interface, p.address)).collect();
        s.push_str(&format!(
            "PortMap {ns}/{name}: {programmed}; endpoint {endpoint}; published [{}]\n",
            published.join(", ")
        ));
    }
    s
}

fn up(dir: &Path, topology: Option<&Path>, manifests: Option<&Path>) -> anyhow::Result<ExitCode> {
    if dir.join(RECORD).exists() {
        let r = load_record(dir)?;
        bail!("lab {} is up in {} already; `kuport-lab down` removes it", r.id, dir.display());
    }
    let t = match topology {
        Some(p) => Topology::load(p)?,
        None => Topology::default_lab(),
    };
    let m = match manifests {
        Some(p) => Manifests::from_dir(p)?,
        None => Manifests::default_lab(),
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("topology.yaml"), t.to_yaml())?;
    let bin = std::env::current_exe().context("finding this binary")?;
    let started = std::time::Instant::now();
    let options = LabOptions { id: None, servers: ServerMode::Processes { bin, log_dir: dir.to_path_buf() } };
    let mut lab = Lab::create(&t, options)?;
    save(dir, &lab, None)?;
    lab.disarm();
    println!(
        "lab {}: {} namespaces, {} echo servers, built in {:.2} s",
        lab.id(),
        lab.namespaces().len(),
        lab.server_pids().len(),
        started.elapsed().as_secs_f64()
    );
    let result = program(&mut lab, &m);
    save(dir, &lab, result.as_ref().ok())?;
    let out = result?;
    print!("{}", summary(&out));
    // Probe every published address a client can reach, from the first client attached there.
    let mut failed = false;
    for (key, nodes) in &out.programming {
        let (Some(st), Some(pm)) = (
            out.port_maps.get(key),
            m.cluster.port_maps.iter().find(|p| {
                p.metadata.namespace.as_deref() == Some(key.0.as_str()) && p.metadata.name.as_deref() == Some(&key.1)
            }),
        ) else {
            continue;
        };
        let proto = match pm.spec.protocol {
            kuport_controller::api::Protocol::Tcp => Protocol::Tcp,
            kuport_controller::api::Protocol::Udp => Protocol::Udp,
        };
        for p in st.published.iter().filter(|p| nodes.contains(&p.node)) {
            let Some(client) = t.clients_on(&p.node, &p.interface).first().map(|c| (*c).clone()) else { continue };
            let Ok(addr) = p.address.parse() else { continue };
            let to = SocketAddrV4::new(addr, pm.spec.port);
            match lab.probe(&client.name, to, proto) {
                Ok(a) => {
                    let ok = *a.seen.ip() == client.address && a.reply_from == to;
                    failed |= !ok;
                    println!(
                        "probe {} ({}) -> {a}{}",
                        client.name,
                        client.address,
                        if ok { "  [client address intact]" } else { "  [WRONG]" }
                    );
                }
                Err(e) => {
                    failed = true;
                    println!("probe {} ({}) -> {to}/{proto}: {e}", client.name, client.address);
                }
            }
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn status(dir: &Path) -> anyhow::Result<ExitCode> {
    let r = load_record(dir)?;
    let present = sys::netns_list()?;
    println!("lab {} (state in {})", r.id, dir.display());
    for ns in &r.namespaces {
        println!("  netns {ns}{}", if present.contains(ns) { "" } else { "  MISSING" });
    }
    for (pod, pid) in &r.servers {
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        println!("  echo server of {pod}: pid {pid}{}", if alive { "" } else { "  NOT RUNNING" });
    }
    match std::fs::read_to_string(dir.join(PORTMAPS)) {
        Ok(s) => print!("{s}"),
        Err(_) => println!("  nothing programmed yet"),
    }
    Ok(ExitCode::SUCCESS)
}

fn down(dir: &Path) -> anyhow::Result<ExitCode> {
    let r = match load_record(dir) {
        Ok(r) => r,
        Err(_) if !dir.join(RECORD).exists() => {
            println!("no lab at {}", dir.display());
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let id = r.id.clone();
    Lab::attach(r).teardown()?;
    // Only the files the lab writes, then the folder if that empties it.
    let mut names = vec![RECORD.to_string(), PORTMAPS.into(), RENDER.into(), "topology.yaml".into()];
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("serve-") && n.ends_with(".log") {
                names.push(n);
            }
        }
    }
    for n in names {
        let _ = std::fs::remove_file(dir.join(n));
    }
    let _ = std::fs::remove_dir(dir);
    println!("lab {id} removed");
    Ok(ExitCode::SUCCESS)
}

fn serve(netns: &Path, pod: &str, tcp: &[Ports], udp: &[Ports]) -> anyhow::Result<ExitCode> {
    use std::io::Write as _;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let _server = echo::PodServer::start(rt.handle(), netns, pod, tcp, udp)?;
    println!("ready");
    std::io::stdout().flush()?;
    // Serve until killed.
    rt.block_on(std::future::pending::<()>());
    Ok(ExitCode::SUCCESS)
}
