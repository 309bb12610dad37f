//! The Debug service: read-only answers for kuportctl and grpcurl, served by every replica.
//! With [`DebugAccess`], every call is authorized by Kubernetes RBAC on every replica,
//! followers included: GetNode needs `get nodestates` named after the node, ListNodes `list
//! nodestates`, ExplainPortMap `get portmaps` in its namespace (group kuport.wlz.li).

use std::sync::Arc;

use kuport_proto::v1::debug_server::Debug;
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
use crate::stream::Hub;
use crate::stream::hub::NodeSnapshot;
use crate::trust::access::{DebugAccess, resource};

/// How long ExplainPortMap waits for an executor's counters.
const COUNTER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

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

#[tonic::async_trait]
impl Debug for DebugService {
    async fn get_node(&self, request: Request<GetNodeRequest>) -> Result<Response<NodeDebug>, Status> {
        self.allow(&request, "get", resource::NODE_STATES, None, Some(&request.get_ref().node)).await?;
        let name = request.into_inner().node;
        let (out, _) = self.hub.outputs();
        match self.hub.node(&name) {
            Some(v) => Ok(Response::new(node_debug(v, true, out.overlay.get(&name)))),
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
                node_debug(v, false, o)
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

    async fn trace(&self, _request: Request<TraceRequest>) -> Result<Response<TraceReport>, Status> {
        Err(Status::unimplemented("trace"))
    }
}
