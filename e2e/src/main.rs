//! kuport-lab: a simulated cluster in network namespaces, programmed by kuport.
//!
//! `up` builds a topology, starts a local API server and kuport on it (two controller replicas
//! electing a leader, one executor process per node; `--folder` runs one controller on a
//! manifest folder instead); `apply` replaces the user's manifests;
//! `probe` dials from a host and shows what the pod saw; `exec` runs a command in a host's
//! namespace; `status` shows the lab and kuportctl's nodes table; `down` removes every
//! namespace, process and file the lab made.

// Library paths handle input: no unwrap there (tests may).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use clap::{Parser, Subcommand};
use kuport_controller::api::PortMapStatus;
use kuport_lab::apiserver::ApiServer;
use kuport_lab::lab::{Lab, LabOptions, Record, ServerMode};
use kuport_lab::plane::{self, KubeSource, Plane, PlaneOptions};
use kuport_lab::topology::{Ports, Protocol, Topology};
use kuport_lab::{Manifests, echo, process, sys};

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
    /// Builds the topology, starts kuport's controller and one executor per node on the
    /// manifests, waits until every node applied its state and probes each published mapping.
    Up {
        /// A topology file, or the name of a shipped one (`default`, `multi`, `sites`:
        /// e2e/topologies/NAME.yaml); the default when absent.
        #[arg(long)]
        topology: Option<PathBuf>,
        /// A folder of PortMapClasses and PortMaps; when absent, the shipped
        /// e2e/manifests/NAME/ of a shipped topology, else e2e/manifests/default/.
        #[arg(long)]
        manifests: Option<PathBuf>,
        /// No API server: one controller reads the lab's manifest folder.
        #[arg(long)]
        folder: bool,
        /// Controller replicas on the API server.
        #[arg(long, default_value_t = 2)]
        replicas: usize,
    },
    /// Replaces the manifests in the controller's folder with those in DIR and waits until
    /// every node applied the result.
    Apply { dir: PathBuf },
    /// Runs a command inside a host's namespace.
    Exec {
        host: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Dials ADDR:PORT from a host (an IPv6 address in brackets, `[2001:db8::9]:27015`); prints
    /// what the pod saw and where the reply came from.
    Probe {
        #[arg(long)]
        from: String,
        #[arg(long, value_parser = kuport_lab::probe::parse_target)]
        to: SocketAddr,
        #[arg(long)]
        udp: bool,
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
    },
    /// Shows the lab's hosts and processes, kuportctl's nodes table and each PortMap's status.
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
    /// Runs a lab controller (started by `up`): on a manifest folder, or a replica on the API
    /// server of a kubeconfig; prints `listening ADDR` once bound.
    #[command(hide = true)]
    Controller {
        #[arg(long, conflicts_with = "kubeconfig")]
        manifests: Option<PathBuf>,
        #[arg(long, requires = "identity")]
        kubeconfig: Option<PathBuf>,
        #[arg(long)]
        identity: Option<String>,
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// kuport's WireGuard mesh (the controller's `--overlay`).
        #[arg(long)]
        overlay: bool,
    },
    /// Runs one node's executor (started by `up`): kuport's NodeSync client and keepers.
    #[command(hide = true)]
    NodeExec {
        #[arg(long)]
        controller: String,
        #[arg(long)]
        node: String,
        /// The node's namespace, where its state is applied.
        #[arg(long)]
        netns: PathBuf,
        /// Where the last applied state is stored.
        #[arg(long)]
        store: PathBuf,
        #[arg(long)]
        underlay_interface: String,
        #[arg(long, default_value_t = 50)]
        backoff_initial_ms: u64,
        #[arg(long, default_value_t = 500)]
        backoff_max_ms: u64,
        /// Its pod-bound token (Kubernetes source), re-read at every connect.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// The controller's CA bundle (https addresses).
        #[arg(long)]
        ca_file: Option<PathBuf>,
    },
    /// Refreshes the executors' tokens at 80% of their life (started by `up` with the API
    /// server): the lab's stand-in for the kubelet's projected token volume.
    #[command(hide = true)]
    Kubelet {
        /// The admin's kubeconfig.
        #[arg(long)]
        kubeconfig: PathBuf,
        /// The lab's id (marks the process as the lab's).
        #[arg(long)]
        lab: String,
        /// NODE=FILE: a node and its token file.
        #[arg(long = "token", value_parser = node_file)]
        tokens: Vec<(String, PathBuf)>,
    },
}

/// `NODE=FILE`.
fn node_file(s: &str) -> Result<(String, PathBuf), String> {
    s.split_once('=')
        .map(|(n, f)| (n.to_string(), PathBuf::from(f)))
        .ok_or_else(|| format!("{s:?}: expected NODE=FILE"))
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
const TOPOLOGY: &str = "topology.yaml";

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let dir = cli.state_dir;
    match cli.command {
        Cmd::Up { topology, manifests, folder, replicas } => {
            up(&dir, topology.as_deref(), manifests.as_deref(), (!folder).then_some(replicas))
        }
        Cmd::Apply { dir: m } => apply(&dir, &m),
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
            match lab.probe_any_with(&from, to, proto, Duration::from_millis(timeout_ms)) {
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
                Some(p) => match p.to_str().filter(|_| !p.exists()).and_then(Topology::shipped) {
                    Some(t) => t,
                    None => Topology::load(&p)?,
                },
                None => Topology::default_lab(),
            };
            print!("{}", kuport_lab::objects::generate(&t).to_yaml());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Serve { netns, pod, tcp, udp } => {
            process::adopt_lifetime()?;
            serve(&netns, &pod, &tcp, &udp)
        }
        Cmd::Controller { manifests, kubeconfig, identity, listen, overlay } => {
            process::adopt_lifetime()?;
            let mut settings = kuport_controller::compute::Settings::default();
            if overlay {
                use kuport_controller::compute::overlay;
                settings.overlay =
                    Some(overlay::OverlaySettings::new(overlay::DEFAULT_INTERFACE, overlay::DEFAULT_LISTEN_PORT)?);
            }
            let source = match (manifests, kubeconfig) {
                (Some(m), _) => plane::ControllerSource::Folder(m),
                (None, Some(kubeconfig)) => {
                    plane::ControllerSource::Kubernetes { kubeconfig, identity: identity.unwrap_or_default() }
                }
                (None, None) => bail!("--manifests or --kubeconfig"),
            };
            plane::run_controller(source, &listen, settings)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::NodeExec {
            controller,
            node,
            netns,
            store,
            underlay_interface,
            backoff_initial_ms,
            backoff_max_ms,
            token_file,
            ca_file,
        } => {
            process::adopt_lifetime()?;
            let mut cfg = kuport_node_exec::sync::Config::new(controller, node);
            cfg.token_file = token_file;
            cfg.ca_file = ca_file;
            cfg.netns = Some(netns);
            cfg.state_dir = Some(store);
            cfg.underlay_interface = Some(underlay_interface);
            cfg.backoff_initial = Duration::from_millis(backoff_initial_ms);
            cfg.backoff_max = Duration::from_millis(backoff_max_ms);
            plane::run_executor(cfg)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Kubelet { kubeconfig, lab: _, tokens } => {
            process::adopt_lifetime()?;
            plane::run_kubelet(kubeconfig, tokens)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn load_record(dir: &Path) -> anyhow::Result<Record> {
    let path = dir.join(RECORD);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("no lab at {} (kuport-lab up makes one)", dir.display()))?;
    serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))
}

fn save(dir: &Path, lab: &Lab) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(&lab.record())?;
    let tmp = dir.join(format!("{RECORD}.tmp"));
    std::fs::write(&tmp, json).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(RECORD))?;
    Ok(())
}

/// A PortMap's line: its Programmed condition, endpoint and published addresses.
fn summary(ns: &str, name: &str, st: &PortMapStatus) -> String {
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
    let endpoint = st.endpoint.as_ref().map(|e| format!("{} on {}", e.address, e.node)).unwrap_or_else(|| "-".into());
    let published: Vec<String> =
        st.published.iter().map(|p| format!("{} {} {}", p.node, p.interface, p.address)).collect();
    format!("PortMap {ns}/{name}: {programmed}; endpoint {endpoint}; published [{}]", published.join(", "))
}

/// Every PortMap of `m` as the controller reports it, one line each.
fn summaries(plane: &Plane, m: &Manifests) -> String {
    let mut s = String::new();
    for pm in &m.cluster.port_maps {
        let (ns, name) =
            (pm.metadata.namespace.clone().unwrap_or_default(), pm.metadata.name.clone().unwrap_or_default());
        match plane.port_map_status(&ns, &name) {
            Ok(st) => s.push_str(&summary(&ns, &name, &st)),
            Err(e) => s.push_str(&format!("PortMap {ns}/{name}: {e}")),
        }
        s.push('\n');
    }
    s
}

/// The lab's API server, in the state dir.
const API_SERVER: &str = "apiserver.json";

fn up(
    dir: &Path,
    topology: Option<&Path>,
    manifests: Option<&Path>,
    replicas: Option<usize>,
) -> anyhow::Result<ExitCode> {
    if dir.join(RECORD).exists() {
        let r = load_record(dir)?;
        bail!("lab {} is up in {} already; `kuport-lab down` removes it", r.id, dir.display());
    }
    // A shipped topology's name, unless a file of that name is there.
    let shipped =
        topology.and_then(|p| p.to_str()).filter(|n| !Path::new(n).exists() && Topology::shipped(n).is_some());
    let t = match (shipped, topology) {
        (Some(name), _) => Topology::shipped(name).ok_or_else(|| anyhow!("no shipped topology {name}"))?,
        (None, Some(p)) => Topology::load(p)?,
        (None, None) => Topology::default_lab(),
    };
    let m = match manifests {
        Some(p) => Manifests::from_dir(p)?,
        None => shipped.and_then(Manifests::shipped).unwrap_or_else(Manifests::default_lab),
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join(TOPOLOGY), t.to_yaml())?;
    let bin = std::env::current_exe().context("finding this binary")?;
    let started = std::time::Instant::now();
    let options =
        LabOptions { id: None, servers: ServerMode::Processes { bin: bin.clone(), log_dir: dir.to_path_buf() } };
    let mut lab = Lab::create(&t, options)?;
    save(dir, &lab)?;
    lab.disarm();
    println!(
        "lab {}: {} namespaces, {} echo servers, built in {:.2} s",
        lab.id(),
        lab.namespaces().len(),
        lab.server_pids().len(),
        started.elapsed().as_secs_f64()
    );
    // Absolute, so the processes' command lines name the same folder from anywhere.
    let dir_abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut options = PlaneOptions::new(bin, &dir_abs);
    options.detached = true;
    if let Some(replicas) = replicas {
        let started = std::time::Instant::now();
        let api = ApiServer::up_showing(&dir_abs.join("controlplane"), true)?;
        std::fs::write(dir.join(API_SERVER), serde_json::to_string_pretty(&api)?)?;
        println!(
            "API server up in {:.2} s; kubectl: KUBECONFIG={} {}/kubectl get portmaps -A",
            started.elapsed().as_secs_f64(),
            api.kubeconfig.display(),
            api.bin.display()
        );
        options.kubernetes =
            Some(KubeSource { admin: api.kubeconfig.clone(), controller: api.kubeconfig.clone(), replicas });
    }
    let started = std::time::Instant::now();
    let result = lab.start_plane(&m, options).map(|_| ());
    save(dir, &lab)?;
    result?;
    if t.overlay {
        let plane = lab.plane().ok_or_else(|| anyhow!("no control plane"))?;
        let took = plane.wait_mesh(plane::CONVERGE_TIMEOUT)?;
        println!("the mesh is computed and applied on every node {:.2} s after start", took.as_secs_f64());
    }
    let plane = lab.plane().ok_or_else(|| anyhow!("no control plane"))?;
    plane.wait_converged(plane::CONVERGE_TIMEOUT)?;
    let leader = plane.leader().unwrap_or_default();
    println!(
        "{} controller replica(s), leader pid {} on {}; {} executors: every node applied its state {:.2} s after start",
        plane.addresses().len(),
        plane.controller_pid(leader).unwrap_or_default(),
        plane.address().map(|a| a.to_string()).unwrap_or_default(),
        plane.node_names().len(),
        started.elapsed().as_secs_f64(),
    );
    if replicas.is_some() {
        let file = dir_abs.join(kuport_lab::plane::trust::KUBECONFIG_FILE);
        plane.write_kubeconfig(&file)?;
        println!(
            "kuportctl, or kubectl kuport (kuportctl linked as kubectl-kuport on PATH), finds the leader with only: KUBECONFIG={} kubectl kuport nodes",
            file.display()
        );
    }
    // Published addresses come from the executors' reported interfaces (on the API server
    // there are no NodeFacts): they may follow convergence by a recompute.
    let keys: Vec<(String, String)> = m
        .cluster
        .port_maps
        .iter()
        .map(|pm| (pm.metadata.namespace.clone().unwrap_or_default(), pm.metadata.name.clone().unwrap_or_default()))
        .collect();
    let waited = std::time::Instant::now();
    while waited.elapsed() < Duration::from_secs(5)
        && keys.iter().any(|(ns, name)| {
            plane.port_map_status(ns, name).is_ok_and(|st| st.published.iter().any(|p| p.address.is_empty()))
        })
    {
        std::thread::sleep(plane::POLL);
    }
    print!("{}", summaries(plane, &m));
    // Probe every published address a client can reach, from the first client attached there.
    let mut failed = false;
    for pm in &m.cluster.port_maps {
        let (ns, name) =
            (pm.metadata.namespace.clone().unwrap_or_default(), pm.metadata.name.clone().unwrap_or_default());
        let (Ok(st), Ok(explained)) = (plane.port_map_status(&ns, &name), plane.explain(&ns, &name)) else { continue };
        let accepting: Vec<&str> =
            explained.nodes.iter().filter(|n| n.role.starts_with("accepting")).map(|n| n.node.as_str()).collect();
        let proto = match pm.spec.protocol {
            kuport_controller::api::Protocol::Tcp => Protocol::Tcp,
            kuport_controller::api::Protocol::Udp => Protocol::Udp,
        };
        for p in st.published.iter().filter(|p| accepting.contains(&p.node.as_str())) {
            let Ok(addr) = p.address.parse::<IpAddr>() else { continue };
            // The first client attached there that has an address of the published one's family.
            let client = t
                .clients_on(&p.node, &p.interface)
                .into_iter()
                .find_map(|c| lab.client_address_like(&c.name, addr).map(|a| (c.name.clone(), a)));
            let Some((client, own)) = client else { continue };
            let to = SocketAddr::new(addr, pm.spec.port);
            match lab.probe_any(&client, to, proto) {
                Ok(a) => {
                    let ok = a.seen.ip() == own && a.reply_from == to;
                    failed |= !ok;
                    println!(
                        "probe {client} ({own}) -> {a}{}",
                        if ok { "  [client address intact]" } else { "  [WRONG]" }
                    );
                }
                Err(e) => {
                    failed = true;
                    println!("probe {client} ({own}) -> {to}/{proto}: {e}");
                }
            }
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// The controller reads its folder every 250 ms and recomputes after 100 ms of quiet: a change
/// that alters no node's state shows no new version, so `apply` waits at least this long.
const PICKUP: Duration = Duration::from_millis(600);

fn apply(dir: &Path, from: &Path) -> anyhow::Result<ExitCode> {
    let mut lab = Lab::attach(load_record(dir)?);
    let m = Manifests::from_dir(from)?;
    let plane = lab.plane_mut().ok_or_else(|| anyhow!("the lab in {} runs no controller", dir.display()))?;
    let before = plane.nodes()?;
    let started = std::time::Instant::now();
    plane.set_manifests(&m)?;
    let nodes = plane.node_names();
    let old = |n: &str| before.iter().find(|r| r.node == n).map(|r| r.desired_version.clone()).unwrap_or_default();
    plane.wait("the new manifests to be applied", plane::CONVERGE_TIMEOUT, |rows| {
        plane::converged(rows, &nodes)
            && (started.elapsed() >= PICKUP || rows.iter().any(|r| r.desired_version != old(&r.node)))
    })?;
    println!(
        "applied {} file(s) from {}; every node applied its state after {:.2} s",
        m.files.len(),
        from.display(),
        started.elapsed().as_secs_f64()
    );
    print!("{}", summaries(plane, &m));
    Ok(ExitCode::SUCCESS)
}

fn status(dir: &Path) -> anyhow::Result<ExitCode> {
    let r = load_record(dir)?;
    let present = sys::netns_list()?;
    println!("lab {} (state in {})", r.id, dir.display());
    for ns in &r.namespaces {
        println!("  netns {ns}{}", if present.contains(ns) { "" } else { "  MISSING" });
    }
    for (pod, pid) in &r.servers {
        println!("  echo server of {pod}: pid {pid}{}", running(*pid));
    }
    let lab = Lab::attach(r);
    let Some(plane) = lab.plane() else {
        println!("  no controller runs");
        return Ok(ExitCode::SUCCESS);
    };
    let leader = plane.leader();
    for (i, address) in plane.addresses().into_iter().enumerate() {
        let role = if leader == Some(i) { " (leader)" } else { "" };
        match plane.controller_pid(i) {
            Some(pid) => println!("  controller {i}: pid {pid} on {address}{role}{}", running(pid)),
            None => println!("  controller {i}: not started"),
        }
    }
    for node in plane.node_names() {
        match plane.executor_pid(&node) {
            Some(pid) => println!("  executor of {node}: pid {pid}{}", running(pid)),
            None => println!("  executor of {node}: not started"),
        }
    }
    if let Some(pid) = plane.record().kubelet {
        println!("  token refresher (the executors' pod-bound tokens): pid {pid}{}", running(pid));
    }
    match plane.nodes_table() {
        Ok(table) => print!("{table}"),
        Err(e) => {
            println!("{e}");
            return Ok(ExitCode::FAILURE);
        }
    }
    match Manifests::from_dir(&plane.manifests_dir()) {
        Ok(m) => print!("{}", summaries(plane, &m)),
        Err(e) => println!("{e}"),
    }
    Ok(ExitCode::SUCCESS)
}

fn running(pid: u32) -> &'static str {
    if plane::alive(pid) { "" } else { "  NOT RUNNING" }
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
    let plane_dir = r.plane.as_ref().map(|p| p.dir.clone());
    Lab::attach(r).teardown()?;
    // The API server after the controllers (they would log its absence).
    if let Ok(text) = std::fs::read_to_string(dir.join(API_SERVER)) {
        let api: ApiServer = serde_json::from_str(&text).with_context(|| format!("reading {API_SERVER}"))?;
        api.down()?;
    }
    // Only the files the lab writes, then the folder if that empties it.
    if let Some(p) = plane_dir {
        plane::remove_files(&p);
    }
    let mut names =
        vec![RECORD.to_string(), TOPOLOGY.into(), API_SERVER.into(), kuport_lab::plane::trust::KUBECONFIG_FILE.into()];
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
