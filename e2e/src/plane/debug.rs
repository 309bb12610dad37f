//! The leader's Debug service: the nodes it knows, their desired states, why a PortMap is or is
//! not programmed, and waiting until what it reports converges. With the Kubernetes source the
//! lab calls it as kuportctl would: TLS verified against the controller's CA, and a token of the
//! ServiceAccount kuport-lab, which the chart's debug ClusterRole lets read it ([`super::trust`]).

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, anyhow, bail};
use kuport_controller::api::PortMapStatus;
use kuport_controller::ctl;
use kuport_proto::v1::{
    ExplainPortMapRequest, GetNodeRequest, ListNodesRequest, NodeDebug, PortMapExplanation, TraceReport, TraceRequest,
};

use super::{Plane, trust};

/// The lab's Debug client, kuportctl's: every call carries the bearer token, if any.
pub type Client = ctl::Client;

/// A Debug client of `url` (https needs `ca`), with `token` on every call.
pub async fn connect(url: &str, ca: Option<&[u8]>, token: Option<String>) -> anyhow::Result<Client> {
    let credentials = ctl::Credentials { ca_pem: ca.map(<[u8]>::to_vec), token };
    Ok(ctl::connect_with(url, &credentials).await?)
}

/// A Debug token is minted anew when less than this is left of it.
const TOKEN_MARGIN: Duration = Duration::from_secs(600);

/// How often the Debug service is asked while waiting.
pub const POLL: Duration = Duration::from_millis(20);
/// How long a wait for convergence lasts by default.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(20);

/// Whether every named node's executor is connected and has applied its desired state.
pub fn converged(rows: &[NodeDebug], nodes: &[String]) -> bool {
    nodes.iter().all(|n| rows.iter().any(|r| r.node == *n && synced(r)))
}

/// Connected, a desired state computed, that version applied, no refusal.
pub fn synced(r: &NodeDebug) -> bool {
    r.connected && !r.desired_version.is_empty() && r.desired_version == r.acked_version && r.errors.is_empty()
}

impl Plane {
    /// The CA bundle (Kubernetes source; None with the folder).
    pub fn ca(&self) -> anyhow::Result<Option<Vec<u8>>> {
        if !self.secure() {
            return Ok(None);
        }
        let path = self.ca_file();
        std::fs::read(&path).map(Some).with_context(|| format!("reading {}", path.display()))
    }

    /// The lab's Debug token (Kubernetes source; None with the folder): the last one minted, or
    /// a new one when it is close to its end.
    pub fn debug_token(&self) -> anyhow::Result<Option<String>> {
        if !self.secure() {
            return Ok(None);
        }
        let mut cached = self.debug_token.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = cached.as_ref()
            && t.expires > SystemTime::now() + TOKEN_MARGIN
        {
            return Ok(Some(t.token.clone()));
        }
        let client = self.kube()?;
        let t = self.rt.block_on(trust::lab_token(&client))?;
        let token = t.token.clone();
        *cached = Some(t);
        Ok(Some(token))
    }

    /// A new Debug client of the replica at `address`, as the lab calls it.
    pub fn debug_client(&self, address: std::net::SocketAddr) -> anyhow::Result<Client> {
        let (ca, token) = (self.ca()?, self.debug_token()?);
        self.rt.block_on(connect(&self.url(address), ca.as_deref(), token))
    }

    /// Calls the leader's Debug service.
    fn debug<T>(&self, call: impl AsyncFnOnce(&mut Client) -> Result<T, tonic::Status>) -> anyhow::Result<T> {
        let address = self.address().ok_or_else(|| anyhow!("no controller replica leads"))?;
        // Outside the runtime: minting a token blocks on it.
        let (ca, token) = (self.ca()?, self.debug_token()?);
        let url = self.url(address);
        self.rt.block_on(async {
            let cached = self.client.lock().unwrap_or_else(|e| e.into_inner()).take();
            let key = (address, token.clone());
            let mut client = match cached {
                Some((k, c)) if k == key => c,
                _ => connect(&url, ca.as_deref(), token).await?,
            };
            let result = call(&mut client).await;
            // A client that failed is dropped: the next call connects anew.
            if result.is_ok() {
                *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some((key, client));
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

    /// Where a flow stops (Trace), and kuportctl's text of it.
    pub fn trace(&self, request: TraceRequest) -> anyhow::Result<(TraceReport, String)> {
        let r = self.debug(async |c| c.trace(request).await.map(|r| r.into_inner()))?;
        let text = ctl::trace_text(&r);
        Ok((r, text))
    }

    /// A PortMap's status as the controller computed it.
    pub fn port_map_status(&self, namespace: &str, name: &str) -> anyhow::Result<PortMapStatus> {
        let e = self.explain(namespace, name)?;
        serde_yaml::from_str(&e.status_yaml).with_context(|| format!("PortMap {namespace}/{name}: status"))
    }

    /// kuportctl's `nodes` table.
    pub fn nodes_table(&self) -> anyhow::Result<String> {
        let address = self.address().ok_or_else(|| anyhow!("no controller replica leads"))?;
        let mut c = self.debug_client(address)?;
        self.rt.block_on(async { Ok(ctl::nodes(&mut c, ctl::Output::Text).await?) })
    }

    /// kuportctl's `mesh` text.
    pub fn mesh_table(&self) -> anyhow::Result<String> {
        let address = self.address().ok_or_else(|| anyhow!("no controller replica leads"))?;
        let mut c = self.debug_client(address)?;
        self.rt.block_on(async { Ok(ctl::mesh(&mut c, ctl::Output::Text).await?) })
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
