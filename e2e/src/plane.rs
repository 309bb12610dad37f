//! The lab's control plane as real processes: kuport controllers that serve NodeSync and Debug
//! on 127.0.0.1 (one reading a manifest folder, watched for changes; or replicas electing a
//! leader on an API server that mirrors the folder, see [`crate::apiserver`]), and one executor
//! per node, each a process of its own so a test can kill it.
//!
//! Both are this crate's own binary (`kuport-lab controller`, `kuport-lab node-exec`: hidden
//! subcommands that call `kuport_controller::serve::run_standalone` and
//! `kuport_node_exec::sync::run`, see [`run_controller`] and [`run_executor`]), because Cargo
//! gives a test the path of its own package's binaries only. An executor runs in the host
//! namespace and programs its node's namespace through `--netns` (the executor enters it per
//! thread), reports its node's facts from the node's underlay interface, and keeps its last
//! applied state in `nodes/<node>/` of the plane's folder.
//!
//! The folder (the lab state dir for `kuport-lab up`):
//!
//! ```text
//! manifests -> manifests.N   the folder the controller watches (a symlink, swapped atomically)
//! manifests.N/00-lab-objects.yaml   Nodes, Namespaces, Services, EndpointSlices, NodeFacts
//! manifests.N/01-<file>.yaml ...    the user's manifests, in their order
//! nodes/<node>/applied.pb    each executor's stored state
//! controller.log, node-exec-<node>.log
//! ```
//!
//! Every change writes a whole new generation and swaps the link, so the controller never reads
//! a half-replaced set of files (a moment without the classes would withdraw every mapping).

use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use kuport_controller::api::PortMapStatus;
use kuport_controller::ctl;
use kuport_proto::v1::debug_client::DebugClient;
use kuport_proto::v1::{
    DesiredState, ExplainPortMapRequest, GetNodeRequest, ListNodesRequest, NodeDebug, PortMapExplanation,
};
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use crate::apiserver;
use crate::manifests::Manifests;
use crate::sys::netns_path;
use crate::topology::Topology;

/// The folder the controller watches, inside the plane's folder.
pub const MANIFESTS: &str = "manifests";
/// The generated objects' file in it.
pub const OBJECTS_FILE: &str = "00-lab-objects.yaml";
/// The executors' stored states, one folder per node.
pub const STORES: &str = "nodes";
/// Replica `i`'s log.
pub fn controller_log(i: usize) -> String {
    if i == 0 { "controller.log".into() } else { format!("controller-{i}.log") }
}
/// How often the Debug service is asked while waiting.
pub const POLL: Duration = Duration::from_millis(20);
/// How long a wait for convergence lasts by default.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(20);

pub fn executor_log(node: &str) -> String {
    format!("node-exec-{node}.log")
}

/// How the plane's processes run.
#[derive(Debug, Clone)]
pub struct PlaneOptions {
    /// This crate's binary (`env!("CARGO_BIN_EXE_kuport-lab")` in tests, the current
    /// executable for the CLI).
    pub bin: PathBuf,
    /// The plane's folder (manifests, stored states, logs).
    pub dir: PathBuf,
    /// True: the processes get their own session and outlive the process that started them
    /// (`kuport-lab up`). False: they are children that the kernel kills when the thread that
    /// started them ends (a test that dies leaves none behind).
    pub detached: bool,
    /// The executors' reconnect backoff, first and largest delay. The lab uses 50 ms and
    /// 500 ms (the binary's defaults are 200 ms and 10 s) so a restarted controller is found
    /// again within half a second.
    pub backoff: (Duration, Duration),
    /// None: one controller reads the manifest folder. Some: the folder is registered in an
    /// API server and controller replicas elect a leader there.
    pub kubernetes: Option<KubeSource>,
}

/// The Kubernetes source of a plane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeSource {
    /// The kubeconfig the lab registers its objects with (the control plane's admin).
    pub admin: PathBuf,
    /// The kubeconfig the controller replicas run with: the admin's, or a ServiceAccount
    /// token's (the chart's RBAC under test).
    pub controller: PathBuf,
    /// How many controller replicas run.
    pub replicas: usize,
}

impl PlaneOptions {
    pub fn new(bin: impl Into<PathBuf>, dir: impl Into<PathBuf>) -> Self {
        PlaneOptions {
            bin: bin.into(),
            dir: dir.into(),
            detached: false,
            backoff: (Duration::from_millis(50), Duration::from_millis(500)),
            kubernetes: None,
        }
    }
}

/// What another process needs to find the plane's processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlaneRecord {
    pub dir: PathBuf,
    /// Each controller replica's gRPC address (NodeSync, Debug, health, reflection) and pid.
    pub controllers: Vec<(String, Option<u32>)>,
    #[serde(default)]
    pub executors: BTreeMap<String, u32>,
    #[serde(default)]
    pub kubernetes: Option<KubeSource>,
}

/// A process the plane started: a child of this process, or known by pid only.
#[derive(Debug)]
struct Proc {
    pid: u32,
    child: Option<Child>,
}

/// One node as its executor is started.
#[derive(Debug, Clone)]
struct NodeRun {
    netns: PathBuf,
    underlay: String,
}

/// One controller replica: its address (kept across restarts) and process.
#[derive(Debug)]
struct Replica {
    address: SocketAddr,
    proc: Option<Proc>,
}

/// The controller and executor processes of a lab, and the folder they work from.
pub struct Plane {
    lab_id: String,
    options: PlaneOptions,
    replicas: Vec<Replica>,
    executors: BTreeMap<String, Proc>,
    nodes: BTreeMap<String, NodeRun>,
    objects: String,
    user: Vec<(String, String)>,
    rt: tokio::runtime::Runtime,
    /// The Debug client of the last answering replica, with its address.
    client: Mutex<Option<(SocketAddr, DebugClient<Channel>)>>,
    /// The admin's API client (Kubernetes source).
    kube: Mutex<Option<kube::Client>>,
}

impl std::fmt::Debug for Plane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plane")
            .field("dir", &self.options.dir)
            .field(
                "controllers",
                &self.replicas.iter().map(|r| (r.address, r.proc.as_ref().map(|p| p.pid))).collect::<Vec<_>>(),
            )
            .field("executors", &self.executors.iter().map(|(n, p)| (n, p.pid)).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Whether every named node's executor is connected and has applied its desired state.
pub fn converged(rows: &[NodeDebug], nodes: &[String]) -> bool {
    nodes.iter().all(|n| rows.iter().any(|r| r.node == *n && synced(r)))
}

/// Connected, a desired state computed, that version applied, no refusal.
pub fn synced(r: &NodeDebug) -> bool {
    r.connected && !r.desired_version.is_empty() && r.desired_version == r.acked_version && r.errors.is_empty()
}

impl Plane {
    fn new(lab_id: &str, topology: &Topology, objects: String, options: PlaneOptions) -> anyhow::Result<Plane> {
        let nodes = topology
            .nodes
            .iter()
            .map(|n| {
                let run = NodeRun {
                    netns: netns_path(&format!("{lab_id}-{}", n.name)),
                    underlay: n.underlay.interface.clone(),
                };
                (n.name.clone(), run)
            })
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a runtime")?;
        let count = options.kubernetes.as_ref().map_or(1, |k| k.replicas.max(1));
        let replicas =
            (0..count).map(|_| Replica { address: SocketAddr::from(([127, 0, 0, 1], 0)), proc: None }).collect();
        Ok(Plane {
            lab_id: lab_id.to_string(),
            options,
            replicas,
            executors: BTreeMap::new(),
            nodes,
            objects,
            user: Vec::new(),
            rt,
            client: Mutex::new(None),
            kube: Mutex::new(None),
        })
    }

    /// Writes the folder (`objects` and the user's `manifests`; with the Kubernetes source,
    /// installs the CRDs and registers the folder's objects), starts the controller replicas on
    /// free ports of 127.0.0.1 and one executor per node. Does not wait for convergence.
    pub(crate) fn start(
        lab_id: &str,
        topology: &Topology,
        objects: String,
        manifests: &Manifests,
        options: PlaneOptions,
    ) -> anyhow::Result<Plane> {
        let mut plane = Plane::new(lab_id, topology, objects, options)?;
        std::fs::create_dir_all(plane.dir()).with_context(|| format!("creating {}", plane.dir().display()))?;
        plane.user = manifests.files.clone();
        let crds = match plane.options.kubernetes.is_some() {
            true => plane.kube().and_then(|c| plane.rt.block_on(apiserver::prepare(&c))),
            false => Ok(()),
        };
        let started = crds.and_then(|()| plane.write_folder()).and_then(|()| plane.start_controller()).and_then(|()| {
            for node in plane.nodes.keys().cloned().collect::<Vec<_>>() {
                plane.start_executor(&node)?;
            }
            Ok(())
        });
        if let Err(e) = started {
            // Whatever started goes, detached or not: nothing would know of it.
            plane.stop();
            return Err(e);
        }
        Ok(plane)
    }

    /// The plane of a lab another process made, from its record: its processes are known by
    /// pid, and its folder can be rewritten.
    pub(crate) fn attach(
        lab_id: &str,
        topology: &Topology,
        objects: String,
        record: &PlaneRecord,
        bin: PathBuf,
    ) -> anyhow::Result<Plane> {
        let mut options = PlaneOptions::new(bin, &record.dir);
        options.detached = true;
        options.kubernetes = record.kubernetes.clone();
        let mut plane = Plane::new(lab_id, topology, objects, options)?;
        // An unreadable address still leaves the processes to stop by pid.
        plane.replicas = record
            .controllers
            .iter()
            .map(|(a, pid)| Replica {
                address: a.parse().unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
                proc: pid.map(|pid| Proc { pid, child: None }),
            })
            .collect();
        plane.executors =
            record.executors.iter().map(|(n, pid)| (n.clone(), Proc { pid: *pid, child: None })).collect();
        Ok(plane)
    }

    pub fn record(&self) -> PlaneRecord {
        PlaneRecord {
            dir: self.options.dir.clone(),
            controllers: self
                .replicas
                .iter()
                .map(|r| (r.address.to_string(), r.proc.as_ref().map(|p| p.pid)))
                .collect(),
            executors: self.executors.iter().map(|(n, p)| (n.clone(), p.pid)).collect(),
            kubernetes: self.options.kubernetes.clone(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.options.dir
    }

    /// The leading controller's gRPC address: the only replica's, or the Lease holder's
    /// (None while no replica holds it).
    pub fn address(&self) -> Option<SocketAddr> {
        if self.options.kubernetes.is_none() {
            return self.replicas.first().map(|r| r.address);
        }
        let client = self.kube().ok()?;
        let leader = self.rt.block_on(apiserver::leader(&client)).ok().flatten()?;
        leader.parse().ok()
    }

    /// The index of the leading replica.
    pub fn leader(&self) -> Option<usize> {
        let address = self.address()?;
        self.replicas.iter().position(|r| r.address == address)
    }

    /// Every replica's address.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.replicas.iter().map(|r| r.address).collect()
    }

    /// The admin's API client (Kubernetes source only).
    pub fn kube(&self) -> anyhow::Result<kube::Client> {
        let source = self.options.kubernetes.as_ref().ok_or_else(|| anyhow!("the plane reads a folder"))?;
        let mut cached = self.kube.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cached.as_ref() {
            return Ok(c.clone());
        }
        let c = self.rt.block_on(apiserver::client(&source.admin))?;
        *cached = Some(c.clone());
        Ok(c)
    }

    /// The lab's nodes, each with an executor.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.keys().cloned().collect()
    }

    /// The pid of replica `i`, if it runs.
    pub fn controller_pid(&self, i: usize) -> Option<u32> {
        self.replicas.get(i).and_then(|r| r.proc.as_ref()).map(|p| p.pid)
    }

    pub fn executor_pid(&self, node: &str) -> Option<u32> {
        self.executors.get(node).map(|p| p.pid)
    }

    /// The folder the controller watches (a symlink to the current generation).
    pub fn manifests_dir(&self) -> PathBuf {
        self.dir().join(MANIFESTS)
    }

    /// An executor's stored-state folder.
    pub fn store(&self, node: &str) -> PathBuf {
        self.dir().join(STORES).join(node)
    }

    /// The state an executor stored as applied last (None: none yet).
    pub fn stored(&self, node: &str) -> anyhow::Result<Option<DesiredState>> {
        Ok(kuport_node_exec::sync::store::load(&self.store(node))?)
    }

    // ---- the folder ----

    /// Replaces the user's manifests (the generated objects stay); the controller picks the
    /// change up within its folder poll (250 ms) and debounce (100 ms).
    pub fn set_manifests(&mut self, manifests: &Manifests) -> anyhow::Result<()> {
        self.user = manifests.files.clone();
        self.write_folder()
    }

    /// Replaces the generated objects (after a pod moved, say).
    pub fn set_objects(&mut self, objects: String) -> anyhow::Result<()> {
        self.objects = objects;
        self.write_folder()
    }

    /// Writes a new generation and points the watched folder at it, then removes all but the
    /// previous generation. With the Kubernetes source, the API server is then made to hold
    /// the new generation's objects and none of the old one's that it lacks.
    fn write_folder(&mut self) -> anyhow::Result<()> {
        let old = match self.options.kubernetes {
            Some(_) => apiserver::folder_docs(&self.manifests_dir())?,
            None => Vec::new(),
        };
        self.write_generation()?;
        if self.options.kubernetes.is_some() {
            let new = apiserver::folder_docs(&self.manifests_dir())?;
            let client = self.kube()?;
            self.rt.block_on(apiserver::sync(&client, &old, &new))?;
        }
        Ok(())
    }

    fn write_generation(&mut self) -> anyhow::Result<()> {
        let dir = self.dir().to_path_buf();
        let generations = generations(&dir)?;
        let n = generations.last().map_or(1, |g| g + 1);
        let target = format!("{MANIFESTS}.{n}");
        let folder = dir.join(&target);
        std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
        let mut files = vec![(OBJECTS_FILE.to_string(), self.objects.clone())];
        for (i, (name, text)) in self.user.iter().enumerate() {
            let base = Path::new(name).file_name().map(|b| b.to_string_lossy().into_owned()).unwrap_or_default();
            let base = if base.ends_with(".yaml") || base.ends_with(".yml") { base } else { format!("{base}.yaml") };
            files.push((format!("{:02}-{base}", i + 1), text.clone()));
        }
        for (name, text) in &files {
            let path = folder.join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        let link = dir.join(MANIFESTS);
        let tmp = dir.join(format!(".{MANIFESTS}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp).with_context(|| format!("linking {}", tmp.display()))?;
        std::fs::rename(&tmp, &link).with_context(|| format!("replacing {}", link.display()))?;
        for g in generations.iter().filter(|g| **g + 1 < n) {
            let _ = std::fs::remove_dir_all(dir.join(format!("{MANIFESTS}.{g}")));
        }
        Ok(())
    }

    // ---- processes ----

    /// Starts every controller replica that does not run: on a free port the first time, on
    /// the same address again after [`Plane::kill_controller`].
    pub fn start_controller(&mut self) -> anyhow::Result<()> {
        let idle = self.replicas_running(false);
        if idle.is_empty() {
            bail!("every controller replica runs already");
        }
        idle.into_iter().try_for_each(|i| self.start_replica(i))
    }

    /// The replicas that run (or not).
    fn replicas_running(&self, running: bool) -> Vec<usize> {
        (0..self.replicas.len()).filter(|i| self.replicas[*i].proc.is_some() == running).collect()
    }

    fn start_replica(&mut self, i: usize) -> anyhow::Result<()> {
        let listen = self.replicas[i].address.to_string();
        let mut cmd = Command::new(&self.options.bin);
        cmd.arg("controller").arg("--listen").arg(&listen);
        match &self.options.kubernetes {
            None => cmd.arg("--manifests").arg(self.manifests_dir()),
            Some(k) => cmd.arg("--kubeconfig").arg(&k.controller).arg("--identity").arg(self.identity(i)),
        };
        let log = self.dir().join(controller_log(i));
        let (proc, line) = spawn(cmd, &log, self.options.detached, true)?;
        let line = line.unwrap_or_default();
        let Some(address) = line.trim().strip_prefix("listening ").and_then(|a| a.parse().ok()) else {
            kill(proc, Duration::from_secs(1));
            bail!("the controller did not start: {:?}; {}", line.trim(), tail(&log));
        };
        self.replicas[i] = Replica { address, proc: Some(proc) };
        Ok(())
    }

    /// Replica `i`'s name in the Lease: the lab's id keeps labs apart, and marks the process
    /// as the lab's.
    fn identity(&self, i: usize) -> String {
        format!("{}-controller-{i}", self.lab_id)
    }

    /// Kills controller replica `i` with SIGKILL and waits until it is gone.
    pub fn kill_replica(&mut self, i: usize) -> anyhow::Result<()> {
        let p =
            self.replicas.get_mut(i).and_then(|r| r.proc.take()).ok_or_else(|| anyhow!("replica {i} does not run"))?;
        kill(p, Duration::ZERO);
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    /// Kills every controller replica with SIGKILL.
    pub fn kill_controller(&mut self) -> anyhow::Result<()> {
        let running = self.replicas_running(true);
        if running.is_empty() {
            bail!("no controller runs");
        }
        running.into_iter().try_for_each(|i| self.kill_replica(i))
    }

    /// Starts the executor of `node`.
    pub fn start_executor(&mut self, node: &str) -> anyhow::Result<()> {
        if self.executors.contains_key(node) {
            bail!("the executor of {node} runs already");
        }
        let run = self.nodes.get(node).cloned().ok_or_else(|| anyhow!("no node {node:?} in this lab"))?;
        let store = self.store(node);
        std::fs::create_dir_all(&store).with_context(|| format!("creating {}", store.display()))?;
        let (first, max) = self.options.backoff;
        let mut cmd = Command::new(&self.options.bin);
        let controllers: Vec<String> = self.replicas.iter().map(|r| format!("http://{}", r.address)).collect();
        cmd.arg("node-exec")
            .arg("--controller")
            .arg(controllers.join(","))
            .arg("--node")
            .arg(node)
            .arg("--netns")
            .arg(&run.netns)
            .arg("--store")
            .arg(&store)
            .arg("--underlay-interface")
            .arg(&run.underlay)
            .arg("--backoff-initial-ms")
            .arg(first.as_millis().to_string())
            .arg("--backoff-max-ms")
            .arg(max.as_millis().to_string());
        let (proc, _) = spawn(cmd, &self.dir().join(executor_log(node)), self.options.detached, false)?;
        self.executors.insert(node.to_string(), proc);
        Ok(())
    }

    /// Kills the executor of `node` with SIGKILL and waits until it is gone.
    pub fn kill_executor(&mut self, node: &str) -> anyhow::Result<()> {
        let p = self.executors.remove(node).ok_or_else(|| anyhow!("no executor runs for {node:?}"))?;
        kill(p, Duration::ZERO);
        Ok(())
    }

    /// Stops every process. Children of this process get SIGKILL (a test's lab goes fast);
    /// processes known by pid only (`kuport-lab down`) get SIGTERM, then SIGKILL after 2 s,
    /// and only while their command line is still the lab's. Executors leave the datapath in
    /// place either way.
    pub fn stop(&mut self) {
        let id = self.lab_id.clone();
        let manifests = self.manifests_dir().display().to_string();
        let kube = self.options.kubernetes.is_some();
        let mut procs = Vec::new();
        for p in std::mem::take(&mut self.executors).into_values() {
            if p.child.is_some() || owned(p.pid, &["node-exec", &format!("{id}-")]) {
                procs.push(p);
            }
        }
        for i in 0..self.replicas.len() {
            let mark = if kube { self.identity(i) } else { manifests.clone() };
            if let Some(p) = self.replicas[i].proc.take()
                && (p.child.is_some() || owned(p.pid, &["controller", &mark]))
            {
                procs.push(p);
            }
        }
        for p in &procs {
            signal(p.pid, if p.child.is_some() { libc::SIGKILL } else { libc::SIGTERM });
        }
        for p in procs {
            let grace = if p.child.is_some() { Duration::ZERO } else { Duration::from_secs(2) };
            kill(p, grace);
        }
    }

    // ---- the Debug service ----

    /// Calls the leader's Debug service.
    fn debug<T>(
        &self,
        call: impl AsyncFnOnce(&mut DebugClient<Channel>) -> Result<T, tonic::Status>,
    ) -> anyhow::Result<T> {
        let address = self.address().ok_or_else(|| anyhow!("no controller replica leads"))?;
        self.rt.block_on(async {
            let cached = self.client.lock().unwrap_or_else(|e| e.into_inner()).take();
            let mut client = match cached {
                Some((a, c)) if a == address => c,
                _ => ctl::connect(&address.to_string()).await?,
            };
            let result = call(&mut client).await;
            // A client that failed is dropped: the next call connects anew.
            if result.is_ok() {
                *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some((address, client));
            }
            result.map_err(|e| anyhow!("controller {address}: {:?}: {}", e.code(), e.message()))
        })
    }

    /// Every node the controller knows (ListNodes).
    pub fn nodes(&self) -> anyhow::Result<Vec<NodeDebug>> {
        self.debug(async |c| c.list_nodes(ListNodesRequest {}).await.map(|r| r.into_inner().nodes))
    }

    /// One node with its desired state (GetNode).
    pub fn node(&self, name: &str) -> anyhow::Result<NodeDebug> {
        let node = name.to_string();
        self.debug(async |c| c.get_node(GetNodeRequest { node }).await.map(|r| r.into_inner()))
    }

    /// Why a PortMap is or is not programmed (ExplainPortMap).
    pub fn explain(&self, namespace: &str, name: &str) -> anyhow::Result<PortMapExplanation> {
        let req = ExplainPortMapRequest { namespace: namespace.to_string(), name: name.to_string() };
        self.debug(async |c| c.explain_port_map(req).await.map(|r| r.into_inner()))
    }

    /// A PortMap's status as the controller computed it.
    pub fn port_map_status(&self, namespace: &str, name: &str) -> anyhow::Result<PortMapStatus> {
        let e = self.explain(namespace, name)?;
        serde_yaml::from_str(&e.status_yaml).with_context(|| format!("PortMap {namespace}/{name}: status"))
    }

    /// kuportctl's `nodes` table.
    pub fn nodes_table(&self) -> anyhow::Result<String> {
        let address = self.address().ok_or_else(|| anyhow!("no controller replica leads"))?.to_string();
        self.rt.block_on(async {
            let mut c = ctl::connect(&address).await?;
            Ok(ctl::nodes(&mut c, ctl::Output::Text).await?)
        })
    }

    /// Polls the Debug service every [`POLL`] until `check` holds for its rows; the rows and
    /// how long it took. The error shows the last rows (or why the controller did not answer).
    pub fn wait(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&[NodeDebug]) -> bool,
    ) -> anyhow::Result<(Vec<NodeDebug>, Duration)> {
        let started = Instant::now();
        loop {
            let rows = self.nodes();
            if let Ok(rows) = &rows
                && check(rows)
            {
                return Ok((rows.clone(), started.elapsed()));
            }
            if started.elapsed() > timeout {
                let last = match rows {
                    Ok(_) => self.nodes_table().unwrap_or_else(|e| e.to_string()),
                    Err(e) => e.to_string(),
                };
                bail!("{what}: not within {:.1} s; last answer:\n{last}", timeout.as_secs_f64());
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until every lab node's executor is connected and has applied its desired state.
    pub fn wait_converged(&self, timeout: Duration) -> anyhow::Result<Duration> {
        let nodes = self.node_names();
        self.wait("convergence", timeout, |rows| converged(rows, &nodes)).map(|(_, took)| took)
    }

    /// Waits until the controller has taken in a change: every node in `changed` has a
    /// desired version other than in `before`, and every lab node is converged.
    pub fn wait_changed(
        &self,
        before: &[NodeDebug],
        changed: &[&str],
        timeout: Duration,
    ) -> anyhow::Result<(Vec<NodeDebug>, Duration)> {
        let nodes = self.node_names();
        let old = |n: &str| before.iter().find(|r| r.node == n).map(|r| r.desired_version.clone()).unwrap_or_default();
        self.wait("the change to converge", timeout, |rows| {
            converged(rows, &nodes)
                && changed.iter().all(|n| rows.iter().any(|r| r.node == *n && r.desired_version != old(n)))
        })
    }
}

impl Drop for Plane {
    fn drop(&mut self) {
        // Detached processes outlive this handle (`kuport-lab up`; `down` ends them).
        if !self.options.detached {
            self.stop();
        }
    }
}

/// The generation numbers of `manifests.N` folders in `dir`, ascending.
fn generations(dir: &Path) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(n) = name.strip_prefix(&format!("{MANIFESTS}.")).and_then(|n| n.parse().ok()) {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The files and folders a plane writes into `dir` (for `kuport-lab down`).
pub fn remove_files(dir: &Path) {
    if let Ok(gens) = generations(dir) {
        for g in gens {
            let _ = std::fs::remove_dir_all(dir.join(format!("{MANIFESTS}.{g}")));
        }
    }
    let _ = std::fs::remove_file(dir.join(MANIFESTS));
    let _ = std::fs::remove_file(dir.join(format!(".{MANIFESTS}.tmp")));
    let _ = std::fs::remove_dir_all(dir.join(STORES));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if (n.starts_with("node-exec-") || n.starts_with("controller")) && n.ends_with(".log") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Starts a process with stdin closed and stderr appended to `log`; with `first_line`, waits
/// for its first line on stdout (None if it closed stdout without one).
fn spawn(mut cmd: Command, log: &Path, detached: bool, first_line: bool) -> anyhow::Result<(Proc, Option<String>)> {
    use std::os::unix::process::CommandExt as _;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    cmd.stdin(Stdio::null()).stdout(if first_line { Stdio::piped() } else { Stdio::null() }).stderr(file);
    if detached {
        // SAFETY: setsid is async-signal-safe; the child leaves our session and process group.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
    } else {
        // SAFETY: prctl is async-signal-safe. The child is killed when the thread that started
        // it ends, so a test that panics or is killed leaves no process behind.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let what = format!("{cmd:?}");
    let mut child = cmd.spawn().with_context(|| format!("starting {what}"))?;
    let mut line = None;
    if first_line && let Some(out) = child.stdout.take() {
        let mut text = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut text);
        line = Some(text);
    }
    let pid = child.id();
    // A detached process is reaped by init once this process exits; until then its handle is
    // kept so that it is reaped here when killed.
    Ok((Proc { pid, child: Some(child) }, line))
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill has no memory preconditions.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Ends a process: waits up to `grace` for it to exit after whatever signal it got, then
/// SIGKILLs it and reaps it (children) or waits until it is gone or a zombie (others).
fn kill(mut p: Proc, grace: Duration) {
    let gone = |p: &mut Proc| match &mut p.child {
        Some(c) => c.try_wait().ok().flatten().is_some(),
        None => {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid)).unwrap_or_default();
            stat.is_empty() || stat.contains(") Z ")
        }
    };
    if grace.is_zero() {
        signal(p.pid, libc::SIGKILL);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && !gone(&mut p) {
        std::thread::sleep(Duration::from_millis(5));
    }
    if !gone(&mut p) {
        signal(p.pid, libc::SIGKILL);
    }
    match &mut p.child {
        Some(c) => {
            let _ = c.wait();
        }
        None => {
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline && !gone(&mut p) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// Whether `pid` still runs a command line containing every one of `words`.
fn owned(pid: u32, words: &[&str]) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    !cmdline.is_empty() && words.iter().all(|w| cmdline.contains(w))
}

/// Whether a process runs (not gone, not a zombie).
pub fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z ")
}

/// The last lines of a log, for an error message.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(10);
    format!("{}: {}", log.display(), lines[start..].join("\n"))
}

// ---- the hidden subcommands ----

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KUPORT_LOG_LEVEL")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_writer(std::io::stderr).try_init();
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
/// API server) serving on `listen`; prints `listening ADDR` once bound. Until SIGTERM.
pub fn run_controller(source: ControllerSource, listen: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    init_logs();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the runtime")?;
    rt.block_on(async move {
        let listener =
            tokio::net::TcpListener::bind(listen).await.with_context(|| format!("--listen {listen}: cannot bind"))?;
        let address = listener.local_addr()?;
        let mut out = std::io::stdout();
        writeln!(out, "listening {address}")?;
        out.flush()?;
        match source {
            ControllerSource::Folder(manifests) => {
                let cfg =
                    kuport_controller::serve::Standalone { manifests, settings: Default::default(), advertise: None };
                kuport_controller::serve::run_standalone(cfg, listener, terminated()).await
            }
            ControllerSource::Kubernetes { kubeconfig, identity } => {
                let client = apiserver::client(&kubeconfig).await?;
                let cfg = kuport_controller::serve::Kubernetes {
                    metrics: None,
                    settings: Default::default(),
                    lease_namespace: apiserver::LEASE_NAMESPACE.into(),
                    lease_name: apiserver::LEASE_NAME.into(),
                    identity,
                    advertise: address.to_string(),
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the runtime")?;
    rt.block_on(async move {
        let keepers = kuport_node_exec::sync::NodeKeepers::new(cfg.netns.clone());
        kuport_node_exec::sync::run(cfg, keepers, terminated()).await;
        tracing::info!("stopping; the applied state stays in place");
    });
    Ok(())
}
