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
//! - this module: the [`Plane`] handle, what it starts from and what it records;
//! - [`processes`]: starting, killing and stopping the replicas and executors;
//! - [`folder`]: the manifest folder the controller reads, written a generation at a time;
//! - [`debug`]: the leader's Debug service, and waiting for convergence through it;
//! - [`trust`]: with the Kubernetes source, the executors' Pods and pod-bound tokens, the CA
//!   bundle and the lab's Debug token (TLS and authentication, docs/security.md; the folder
//!   source stays plain text on loopback, unauthenticated);
//! - [`run`]: the hidden subcommands, what runs inside those processes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use kuport_proto::v1::DesiredState;
use serde::{Deserialize, Serialize};

use crate::apiserver;
use crate::manifests::Manifests;
use crate::process::Proc;
use crate::sys::netns_path;
use crate::topology::{NodeSpec, Topology};

pub mod debug;
pub mod folder;
pub mod processes;
pub mod run;
pub mod trust;

pub use crate::process::alive;
pub use debug::{CONVERGE_TIMEOUT, POLL, converged, synced};
pub use folder::{MANIFESTS, OBJECTS_FILE, STORES, remove_files};
pub use processes::{KUBELET_LOG, controller_log, executor_log};
pub use run::{ControllerSource, run_controller, run_executor, run_kubelet};

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
    /// The `kuport-lab kubelet` process refreshing the executors' tokens (Kubernetes source).
    #[serde(default)]
    pub kubelet: Option<u32>,
}

/// One node as its executor is started.
#[derive(Debug, Clone)]
struct NodeRun {
    netns: PathBuf,
    underlay: String,
}

/// The controller's settings a topology asks for: the mesh (no CNI setting: the executors report
/// what the port maps need of the CNI).
#[derive(Debug, Clone, Copy, Default)]
struct Flavour {
    overlay: bool,
}

/// The folder under the plane's where each node's wireguard-go sockets live (its executor's
/// private `/var/run/wireguard`).
pub const WIREGUARD_SOCKETS: &str = "wireguard";

/// One controller replica: its address (kept across restarts) and process.
#[derive(Debug)]
struct Replica {
    address: SocketAddr,
    /// Where it serves /metrics (a replica on the API server only).
    metrics: Option<SocketAddr>,
    proc: Option<Proc>,
}

/// A cached Debug client's replica address and token.
type ClientKey = (SocketAddr, Option<String>);

/// The controller and executor processes of a lab, and the folder they work from.
pub struct Plane {
    lab_id: String,
    options: PlaneOptions,
    replicas: Vec<Replica>,
    executors: BTreeMap<String, Proc>,
    /// The token refresher (Kubernetes source).
    kubelet: Option<Proc>,
    nodes: BTreeMap<String, NodeRun>,
    flavour: Flavour,
    objects: String,
    user: Vec<(String, String)>,
    rt: tokio::runtime::Runtime,
    /// The Debug client of the last answering replica, with its address.
    /// Keyed by the token too: a new token makes a new client.
    client: Mutex<Option<(ClientKey, debug::Client)>>,
    /// The lab's Debug token (Kubernetes source), minted when first needed and again before it ends.
    debug_token: Mutex<Option<trust::Token>>,
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
        let replicas = (0..count)
            .map(|_| Replica { address: SocketAddr::from(([127, 0, 0, 1], 0)), metrics: None, proc: None })
            .collect();
        Ok(Plane {
            lab_id: lab_id.to_string(),
            options,
            replicas,
            executors: BTreeMap::new(),
            kubelet: None,
            nodes,
            flavour: Flavour { overlay: topology.overlay },
            objects,
            user: Vec::new(),
            rt,
            client: Mutex::new(None),
            debug_token: Mutex::new(None),
            kube: Mutex::new(None),
        })
    }

    /// Writes the folder (`objects` and the user's `manifests`; with the Kubernetes source,
    /// installs the CRDs and registers the folder's objects, then the executors' Pods and their
    /// tokens), starts the controller replicas on free ports of 127.0.0.1 (with the Kubernetes
    /// source: waits for their CA bundle and starts the token refresher) and one executor per
    /// node. Does not wait for convergence.
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
        let started = crds
            .and_then(|()| plane.write_folder())
            .and_then(|()| plane.mint_executor_tokens())
            .and_then(|()| plane.start_controller())
            .and_then(|()| plane.fetch_ca())
            .and_then(|()| plane.start_kubelet())
            .and_then(|()| {
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
                metrics: None,
                proc: pid.map(|pid| Proc { pid, child: None }),
            })
            .collect();
        plane.executors =
            record.executors.iter().map(|(n, pid)| (n.clone(), Proc { pid: *pid, child: None })).collect();
        plane.kubelet = record.kubelet.map(|pid| Proc { pid, child: None });
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
            kubelet: self.kubelet.as_ref().map(|p| p.pid),
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

    /// The leading replica's /metrics, as Prometheus text.
    pub fn metrics(&self) -> anyhow::Result<String> {
        use std::io::{Read as _, Write as _};
        let i = self.leader().ok_or_else(|| anyhow::anyhow!("no controller replica leads"))?;
        let address = self.replicas[i].metrics.ok_or_else(|| anyhow::anyhow!("replica {i} serves no metrics"))?;
        let mut conn = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        conn.read_to_string(&mut text)?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
        body.ok_or_else(|| anyhow::anyhow!("{address}: no HTTP answer"))
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

    /// Writes the kubeconfig of the lab's Debug caller to `out` (Kubernetes source only):
    /// `KUBECONFIG=out kubectl kuport nodes` needs nothing else ([`trust::write_kubeconfig`]).
    pub fn write_kubeconfig(&self, out: &std::path::Path) -> anyhow::Result<()> {
        let source = self.options.kubernetes.as_ref().ok_or_else(|| anyhow!("the plane reads a folder"))?;
        let client = self.kube()?;
        self.rt.block_on(trust::write_kubeconfig(&client, &source.admin, out))
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

    /// An executor's stored-state folder (with its WireGuard key, `wireguard.key`).
    pub fn store(&self, node: &str) -> PathBuf {
        self.dir().join(STORES).join(node)
    }

    /// The folder mounted on `/var/run/wireguard` for `node`'s executor and its wireguard-go
    /// daemons (overlay topologies): `wg` finds the node's sockets there.
    pub fn wireguard_sockets(&self, node: &str) -> PathBuf {
        self.dir().join(WIREGUARD_SOCKETS).join(node)
    }

    /// Whether the controller runs the overlay (`--overlay`).
    pub fn overlay(&self) -> bool {
        self.flavour.overlay
    }

    /// Waits until every node's executor applied a state whose WireGuard device peers with
    /// every other node: the mesh is computed whole (the keys are in). How long it took.
    pub fn wait_mesh(&self, timeout: Duration) -> anyhow::Result<Duration> {
        let started = std::time::Instant::now();
        let nodes = self.node_names();
        loop {
            let whole = nodes.iter().all(|n| {
                let Ok(Some(stored)) = self.stored(n) else { return false };
                let host = stored.state.as_ref().and_then(|s| s.netns.iter().find(|ns| ns.is_host()));
                host.is_some_and(|h| h.wireguard_devices.iter().any(|d| d.peers.len() + 1 == nodes.len()))
            });
            if whole && self.wait_converged(timeout).is_ok() {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                anyhow::bail!("the mesh did not form within {:.1} s", timeout.as_secs_f64());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Adds a node the topology did not have (its namespace exists): its executor can then be
    /// started. The objects are the caller's to publish.
    pub(crate) fn add_node(&mut self, lab_id: &str, node: &NodeSpec) {
        let run = NodeRun {
            netns: netns_path(&format!("{lab_id}-{}", node.name)),
            underlay: node.underlay.interface.clone(),
        };
        self.nodes.insert(node.name.clone(), run);
    }

    /// Forgets a node (its executor stopped first).
    pub(crate) fn remove_node(&mut self, node: &str) {
        self.nodes.remove(node);
    }

    /// Whether the plane's gRPC is TLS with tokens (the Kubernetes source) or plain text.
    pub fn secure(&self) -> bool {
        self.options.kubernetes.is_some()
    }

    /// An executor's token file (Kubernetes source), in its folder.
    pub fn token_file(&self, node: &str) -> PathBuf {
        self.store(node).join(trust::TOKEN_FILE)
    }

    /// The CA bundle of the controller's serving certificate (Kubernetes source).
    pub fn ca_file(&self) -> PathBuf {
        self.dir().join(trust::CA_FILE)
    }

    /// The controller address an executor or client dials for replica address `a`.
    pub fn url(&self, a: SocketAddr) -> String {
        if self.secure() { format!("https://{a}") } else { format!("http://{a}") }
    }

    /// The state an executor stored as applied last (None: none yet).
    pub fn stored(&self, node: &str) -> anyhow::Result<Option<DesiredState>> {
        Ok(kuport_node_exec::sync::store::load(&self.store(node))?)
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
