//! The plane's processes: controller replicas (on a free port of 127.0.0.1 the first time, on
//! the same address after a restart), one executor per node and, with the Kubernetes source, the
//! token refresher ([`super::trust`]), started, killed and stopped.

use std::fs::File;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, anyhow, bail};
use rustix::process::Signal;

use super::{Plane, Replica, trust};
use crate::process::{Lifetime, kill, owned, signal, spawn, tail};

/// The token refresher's log.
pub const KUBELET_LOG: &str = "kubelet.log";

/// Replica `i`'s log.
pub fn controller_log(i: usize) -> String {
    if i == 0 { "controller.log".into() } else { format!("controller-{i}.log") }
}

/// Node `node`'s executor log.
pub fn executor_log(node: &str) -> String {
    format!("node-exec-{node}.log")
}

impl Plane {
    /// Detached processes outlive this handle (`kuport-lab up`; `down` ends them).
    fn lifetime(&self) -> Lifetime {
        if self.options.detached { Lifetime::Detached } else { Lifetime::Child }
    }

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
        if self.flavour.overlay {
            cmd.arg("--overlay");
        }
        let log = self.dir().join(controller_log(i));
        let (proc, line) = spawn(cmd, append(&log)?, self.lifetime(), true)?;
        let line = line.unwrap_or_default();
        // `listening ADDR`, then `metrics ADDR` for a replica on the API server.
        let mut words = line.split_whitespace();
        let address = match (words.next(), words.next().map(str::parse)) {
            (Some("listening"), Some(Ok(a))) => a,
            _ => {
                kill(proc, Duration::from_secs(1));
                bail!("the controller did not start: {:?}; {}", line.trim(), tail(&log));
            }
        };
        let metrics = match (words.next(), words.next()) {
            (Some("metrics"), Some(a)) => a.parse().ok(),
            _ => None,
        };
        self.replicas[i] = Replica { address, metrics, proc: Some(proc) };
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

    /// With the Kubernetes source: the ServiceAccounts and debug access (`trust::prepare`), each
    /// node's executor Pod and its token in the node's folder.
    pub(super) fn mint_executor_tokens(&mut self) -> anyhow::Result<()> {
        if !self.secure() {
            return Ok(());
        }
        let client = self.kube()?;
        let nodes = self.node_names();
        self.rt.block_on(async {
            trust::prepare(&client).await?;
            for node in &nodes {
                trust::ensure_pod(&client, node).await?;
            }
            anyhow::Ok(())
        })?;
        nodes.iter().try_for_each(|n| self.refresh_token(n).map(|_| ()))
    }

    /// With the Kubernetes source: a node added after the start gets its executor's Pod and
    /// token (its Node registered first).
    pub(crate) fn prepare_node(&mut self, node: &str) -> anyhow::Result<()> {
        if !self.secure() {
            return Ok(());
        }
        let client = self.kube()?;
        self.rt.block_on(trust::ensure_pod(&client, node))?;
        self.refresh_token(node).map(|_| ())
    }

    /// Mints `node`'s executor token anew into its token file, as a kubelet refreshing the
    /// projected volume would; when the new one expires.
    pub fn refresh_token(&self, node: &str) -> anyhow::Result<SystemTime> {
        let store = self.store(node);
        std::fs::create_dir_all(&store).with_context(|| format!("creating {}", store.display()))?;
        let client = self.kube()?;
        self.rt.block_on(trust::refresh(&client, node, &self.token_file(node)))
    }

    /// With the Kubernetes source: waits until a replica published the CA bundle (ConfigMap
    /// kuport-ca) and copies it to [`Plane::ca_file`].
    pub(super) fn fetch_ca(&mut self) -> anyhow::Result<()> {
        if !self.secure() {
            return Ok(());
        }
        let client = self.kube()?;
        let ca = self.rt.block_on(trust::wait_ca(&client))?;
        let path = self.ca_file();
        std::fs::write(&path, ca).with_context(|| format!("writing {}", path.display()))
    }

    /// With the Kubernetes source: the `kuport-lab kubelet` process that refreshes every node's
    /// token at 80% of its life while the lab lives.
    pub(super) fn start_kubelet(&mut self) -> anyhow::Result<()> {
        let Some(k) = self.options.kubernetes.as_ref() else {
            return Ok(());
        };
        let mut cmd = Command::new(&self.options.bin);
        cmd.arg("kubelet").arg("--kubeconfig").arg(&k.admin).arg("--lab").arg(&self.lab_id);
        for node in self.nodes.keys() {
            cmd.arg("--token").arg(format!("{node}={}", self.token_file(node).display()));
        }
        let (proc, _) = spawn(cmd, append(&self.dir().join(KUBELET_LOG))?, self.lifetime(), false)?;
        self.kubelet = Some(proc);
        Ok(())
    }

    /// Starts the executor of `node` (with the Kubernetes source: with its own token).
    pub fn start_executor(&mut self, node: &str) -> anyhow::Result<()> {
        let token = self.token_file(node);
        self.start_executor_with_token(node, &token)
    }

    /// Starts the executor of `node` with the token in `token` (Kubernetes source; unused with the
    /// folder): another node's token makes an impostor the controller must refuse.
    pub fn start_executor_with_token(&mut self, node: &str, token: &Path) -> anyhow::Result<()> {
        if self.executors.contains_key(node) {
            bail!("the executor of {node} runs already");
        }
        let run = self.nodes.get(node).cloned().ok_or_else(|| anyhow!("no node {node:?} in this lab"))?;
        let store = self.store(node);
        std::fs::create_dir_all(&store).with_context(|| format!("creating {}", store.display()))?;
        let (first, max) = self.options.backoff;
        let mut cmd = match self.flavour.overlay {
            false => Command::new(&self.options.bin),
            true => {
                // wireguard-go's socket folder is fixed and shared by every namespace: the
                // executor (and the daemons it starts) get a private mount namespace with the
                // node's own folder there. unshare and sh exec in place: the pid stays the
                // executor's.
                let sockets = self.wireguard_sockets(node);
                std::fs::create_dir_all(&sockets).with_context(|| format!("creating {}", sockets.display()))?;
                let mut c = Command::new("unshare");
                c.args(["--mount", "--propagation", "private", "sh", "-c"])
                    .arg("mkdir -p /var/run/wireguard && mount --bind \"$0\" /var/run/wireguard && exec \"$@\"")
                    .arg(&sockets)
                    .arg(&self.options.bin);
                c
            }
        };
        let controllers: Vec<String> = self.replicas.iter().map(|r| self.url(r.address)).collect();
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
        if self.secure() {
            cmd.arg("--token-file").arg(token).arg("--ca-file").arg(self.ca_file());
        }
        let (proc, _) = spawn(cmd, append(&self.dir().join(executor_log(node)))?, self.lifetime(), false)?;
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
        if let Some(p) = self.kubelet.take()
            && (p.child.is_some() || owned(p.pid, &["kubelet", &id]))
        {
            procs.push(p);
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
            signal(p.pid, if p.child.is_some() { Signal::KILL } else { Signal::TERM });
        }
        for p in procs {
            let grace = if p.child.is_some() { Duration::ZERO } else { Duration::from_secs(2) };
            kill(p, grace);
        }
    }
}

/// A log opened for appending (a restarted process logs after its predecessor).
fn append(log: &Path) -> anyhow::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))
}
