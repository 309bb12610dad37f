//! The Debug service: read-only answers for kuportctl and grpcurl, served by every replica.
//! With [`DebugAccess`], every call is authorized by Kubernetes RBAC on every replica,
//! followers included: GetNode needs `get nodestates` named after the node, ListNodes `list
//! nodestates`, ExplainPortMap `get portmaps` in its namespace (group kuport.wlz.li).

use std::collections::BTreeMap;
use std::sync::Arc;

use kuport_proto::v1::debug_server::Debug;
use kuport_proto::v1::trace_request::Target;
use kuport_proto::v1::{
    ExplainPortMapRequest, GetNodeRequest, ListNodesRequest, ListNodesResponse, NodeDebug, NodeProgramming,
    PortMapCounters, PortMapExplanation, TraceReport, TraceRequest,
};
use tonic::{Request, Response, Status};

use crate::compute::ObjectKey;
use crate::compute::overlay::{self, NodeOverlay};
use crate::compute::portmap::admission::key_of;
use crate::compute::portmap::links::device_name;
use crate::report::counters::{Owners, attribute};
use crate::report::trace;
use crate::stream::Hub;
use crate::stream::hub::NodeSnapshot;
use crate::trust::access::{DebugAccess, resource};

/// How long ExplainPortMap and Trace wait for an executor's counters.
const COUNTER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// The longest watch a trace takes: a call holds no more than a minute.
const MAX_TRACE_WATCH: u32 = 60;

pub struct DebugService {
    hub: Arc<Hub>,
    /// None: the insecure folder mode, every call answered.
    access: Option<Arc<DebugAccess>>,
}

impl DebugService {
    pub fn new(hub: Arc<Hub>, access: Option<Arc<DebugAccess>>) -> Self {
        DebugService { hub, access }
    }

    /// Ok when the caller may `verb` the `resource`; refusals logged and counted.
    async fn allow<T>(
        &self,
        request: &Request<T>,
        verb: &str,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Result<(), Status> {
        let Some(access) = &self.access else { return Ok(()) };
        access.decide(request.metadata(), verb, resource, namespace, name).await.map_err(|r| {
            self.hub.metrics().debug_refused(r.reason);
            tracing::info!(reason = r.reason, detail = %r.detail, verb, resource, "debug call refused");
            r.into()
        })
    }
}

/// `overlay`: the node's place in the mesh, when the overlay is on.
fn node_debug(v: NodeSnapshot, with_state: bool, overlay: Option<&NodeOverlay>) -> NodeDebug {
    NodeDebug {
        overlay: overlay.map(overlay::debug_lines).unwrap_or_default(),
        node: v.node,
        desired_version: v.desired.as_ref().map(|d| d.version.clone()).unwrap_or_default(),
        desired: if with_state { v.desired.map(|d| (*d).clone()) } else { None },
        connected: v.connected,
        executor_version: v.executor_version,
        acked_version: v.acked.map(|a| a.version).unwrap_or_default(),
        errors: v.errors,
        drift_repairs: v.drift_repairs,
        last_drift: v.last_drift,
        facts: v.facts,
        since_seconds: v.since.as_secs(),
        peers: v.peers,
    }
}

impl DebugService {
    /// The counters of `nodes`, read at once (twice, `watch` seconds apart, with a watch), with
    /// their desired states and drift repairs.
    async fn observe(&self, nodes: &[String], watch: u32) -> trace::Seen {
        let read_all = || {
            futures::future::join_all(nodes.iter().map(|n| {
                let hub = self.hub.clone();
                async move { (n.clone(), hub.read_counters(n, COUNTER_READ_TIMEOUT).await) }
            }))
        };
        let repairs = |n: &str| self.hub.node(n).map(|s| (s.drift_repairs, s.last_drift)).unwrap_or_default();
        let mut seen = trace::Seen { watched: watch, ..Default::default() };
        seen.now = Some(std::time::SystemTime::now());
        let mut first = BTreeMap::new();
        let mut before = BTreeMap::new();
        if watch > 0 {
            for (n, r) in read_all().await {
                before.insert(n.clone(), repairs(&n).0);
                if let Ok(r) = r {
                    first.insert(n, r);
                }
            }
            tokio::time::sleep(std::time::Duration::from_secs(watch.into())).await;
        }
        for (n, r) in read_all().await {
            let (now, last) = repairs(&n);
            seen.drift.insert(n.clone(), (before.get(&n).copied().unwrap_or(now), now, last));
            if let Some(snapshot) = self.hub.node(&n) {
                seen.reach_since.insert(n.clone(), snapshot.reach_since);
                if let Some(state) = snapshot.desired.and_then(|d| d.state.clone()) {
                    seen.states.insert(n.clone(), state);
                }
            }
            let read = r.map(|last| trace::Read { first: first.remove(&n), last });
            seen.reads.insert(n, read);
        }
        seen
    }
}

#[tonic::async_trait]
impl Debug for DebugService {
    async fn get_node(&self, request: Request<GetNodeRequest>) -> Result<Response<NodeDebug>, Status> {
        self.allow(&request, "get", resource::NODE_STATES, None, Some(&request.get_ref().node)).await?;
        let name = request.into_inner().node;
        let (out, _) = self.hub.outputs();
        match self.hub.node(&name) {
            Some(v) => Ok(Response::new(node_debug(v, true, out.overlay.get(&name).map(|o| &**o)))),
            None => Err(Status::not_found(format!("node {name:?}: no desired state and no executor"))),
        }
    }

    async fn list_nodes(&self, request: Request<ListNodesRequest>) -> Result<Response<ListNodesResponse>, Status> {
        self.allow(&request, "list", resource::NODE_STATES, None, None).await?;
        let leader = self.hub.leadership().borrow().leads();
        let (out, _) = self.hub.outputs();
        let nodes = self
            .hub
            .nodes()
            .into_iter()
            .map(|v| {
                let o = out.overlay.get(&v.node);
                node_debug(v, false, o.map(|o| &**o))
            })
            .collect();
        let input_error = self.hub.source_error().unwrap_or_default();
        Ok(Response::new(ListNodesResponse { leader, nodes, input_error }))
    }

    async fn explain_port_map(
        &self,
        request: Request<ExplainPortMapRequest>,
    ) -> Result<Response<PortMapExplanation>, Status> {
        let r = request.get_ref();
        self.allow(&request, "get", resource::PORT_MAPS, Some(&r.namespace), Some(&r.name)).await?;
        let r = request.into_inner();
        let key = (r.namespace.clone(), r.name.clone());
        let (out, inputs) = self.hub.outputs();
        let (Some(status), Some(pm)) = (
            out.port_maps.get(&key),
            inputs.as_ref().and_then(|c| c.port_maps.iter().find(|p| key_of(p) == key).cloned()),
        ) else {
            return Err(Status::not_found(format!(
                "PortMap {}/{}: not in the controller's inputs",
                r.namespace, r.name
            )));
        };
        let status_yaml = serde_yaml::to_string(status).map_err(|e| Status::internal(e.to_string()))?;
        let class = &pm.spec.class_name;
        let pod_node = status.endpoint.as_ref().map(|e| e.node.clone());
        let object = ObjectKey::port_map(&r.namespace, &r.name);
        let mut nodes = Vec::new();
        for node in out.must_ack(&object).iter().cloned() {
            let accepting = out.programming.get(&key).is_some_and(|n| n.contains(&node));
            let is_pod = pod_node.as_deref() == Some(node.as_str());
            let role = match (accepting, is_pod) {
                (true, true) => "accepting, pod",
                (true, false) => "accepting",
                _ => "pod",
            };
            let links = if is_pod {
                out.programming
                    .get(&key)
                    .into_iter()
                    .flatten()
                    .filter(|n| **n != node)
                    .map(|peer| format!("{} to {peer}", device_name(class, peer)))
                    .collect()
            } else {
                pod_node.iter().map(|p| format!("{} to {p}", device_name(class, p))).collect()
            };
            let acked = self.hub.unacked(&object, vec![node.clone()]).is_empty();
            nodes.push(NodeProgramming { node, role: role.to_string(), links, acked, ..Default::default() });
        }
        // Every accepting node's counters at once, live (docs/operations/counters.md).
        let owners = inputs.as_ref().map(|c| Owners::new(&c.port_maps, &out.port_maps)).unwrap_or_default();
        let reads = nodes.iter().filter(|n| n.role.starts_with("accepting")).map(|n| {
            let hub = self.hub.clone();
            let node = n.node.clone();
            async move { (node.clone(), hub.read_counters(&node, COUNTER_READ_TIMEOUT).await) }
        });
        for (node, read) in futures::future::join_all(reads).await {
            let Some(entry) = nodes.iter_mut().find(|n| n.node == node) else { continue };
            let desired = self.hub.node(&node).and_then(|s| s.desired);
            match (read, desired.as_ref().and_then(|d| d.state.as_ref())) {
                (Ok(report), Some(state)) => {
                    let c = attribute(&node, state, &report, &owners).0.remove(&key).unwrap_or_default();
                    entry.counters = Some(PortMapCounters {
                        accepted_packets: c.accepted_packets,
                        accepted_bytes: c.accepted_bytes,
                        connections: c.connections,
                        dropped_source: c.dropped_source,
                        dropped_rate: c.dropped_rate,
                        dropped_connections: c.dropped_connections,
                    });
                    entry.counters_error = report.error.clone();
                }
                (Ok(_), None) => entry.counters_error = format!("node {node}: no desired state"),
                (Err(e), _) => entry.counters_error = e,
            }
        }
        Ok(Response::new(PortMapExplanation { namespace: r.namespace, name: r.name, status_yaml, nodes }))
    }

    async fn trace(&self, request: Request<TraceRequest>) -> Result<Response<TraceReport>, Status> {
        // A trace reads the counters of whichever nodes the path crosses.
        self.allow(&request, "list", resource::NODE_STATES, None, None).await?;
        let r = request.into_inner();
        let watch = r.watch_seconds.min(MAX_TRACE_WATCH);
        let (out, inputs) = self.hub.outputs();
        let Some(inputs) = inputs else {
            return Err(Status::unavailable("the controller has read no inputs yet"));
        };
        let invalid = |e: String| Status::invalid_argument(e);
        let report = match r.target {
            Some(Target::Address(a)) => {
                let t = trace::parse_target(&a).map_err(invalid)?;
                let from = match r.from.as_str() {
                    "" => None,
                    f => Some(f.parse().map_err(|_| invalid(format!("--from {f:?}: not an IP address")))?),
                };
                let nodes = trace::port_map_nodes(&t, &inputs.port_maps, &out);
                let seen = self.observe(&nodes, watch).await;
                trace::port_map(&t, from, &inputs.port_maps, &inputs.classes, &out, &seen)
            }
            Some(Target::Mesh(m)) => {
                let from = trace::mesh_end(&m.from, m.pods, &inputs.pods).map_err(invalid)?;
                let to = trace::mesh_end(&m.to, m.pods, &inputs.pods).map_err(invalid)?;
                let seen = self.observe(&trace::mesh_nodes(&from, &to, &out), watch).await;
                let mut report = trace::mesh(&from, &to, &out, &seen);
                if m.pods {
                    report.subject = format!("pod {} on {from} to pod {} on {to}: {}", m.from, m.to, report.subject);
                }
                report
            }
            Some(Target::Intercept(i)) => {
                let (ns, name) = i.split_once('/').ok_or_else(|| invalid(format!("intercept {i:?}: not NS/NAME")))?;
                let key = (ns.to_string(), name.to_string());
                let ic = inputs
                    .intercepts
                    .iter()
                    .find(|ic| {
                        ic.metadata.namespace.as_deref() == Some(ns) && ic.metadata.name.as_deref() == Some(name)
                    })
                    .ok_or_else(|| Status::not_found(format!("Intercept {i}: not in the controller's inputs")))?;
                let status = out.intercepts.get(&key).cloned().unwrap_or_default();
                let placed = out.intercept_pods.get(&key).cloned().unwrap_or_default();
                let mut nodes: Vec<String> = placed.iter().map(|(_, n)| n.clone()).collect();
                nodes.sort();
                nodes.dedup();
                let unacked = self.hub.unacked(&ObjectKey::intercept(ns, name), nodes.clone());
                let seen = self.observe(&nodes, watch).await;
                trace::intercept(ic, &status, &placed, &unacked, &seen)
            }
            None => return Err(invalid("a trace needs an address, a mesh pair or an Intercept".into())),
        };
        Ok(Response::new(report))
    }
}
