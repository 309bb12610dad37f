//! `kuportctl teardown`: every node's state emptied, then waited for until each connected
//! executor acknowledged it. The chart's pre-delete hook runs it, so that `helm uninstall`
//! leaves the nodes' kernels as they were (docs/operations/uninstall.md).

use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kuport_proto::v1::{ListNodesRequest, ListNodesResponse, NodeState};

use super::{CtlError, Sources, call, connect_with, credentials, discover, kube_config};
use crate::observe::kubernetes::{TEARDOWN_CONFIGMAP, TEARDOWN_KEY};

/// How often the nodes are asked again.
const POLL: Duration = Duration::from_millis(500);

/// Where the teardown stands, per node, from one ListNodes answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Acknowledged an empty state: nothing of kuport left in its kernel.
    pub empty: Vec<String>,
    /// Connected, not there yet.
    pub waiting: Vec<String>,
    /// No executor connected: its kernel keeps kuport's last state.
    pub absent: Vec<String>,
}

impl Progress {
    pub fn of(r: &ListNodesResponse) -> Progress {
        let mut p = Progress::default();
        for n in &r.nodes {
            let empty = kuport_proto::canonical_version(&NodeState { node: n.node.clone(), ..Default::default() });
            if n.desired_version == empty && n.acked_version == empty {
                p.empty.push(n.node.clone());
            } else if n.connected {
                p.waiting.push(n.node.clone());
            } else {
                p.absent.push(n.node.clone());
            }
        }
        p
    }

    fn text(&self) -> String {
        let mut t = String::new();
        for n in &self.empty {
            let _ = writeln!(t, "{n}: empty, acknowledged");
        }
        for n in &self.absent {
            let _ = writeln!(t, "{n}: no executor connected, its kernel keeps kuport's last state");
        }
        for n in &self.waiting {
            let _ = writeln!(t, "{n}: not acknowledged yet");
        }
        t
    }
}

/// Sets the teardown ConfigMap to `asked` (with `undo`, false), then, when asked, waits up to
/// `wait` until every connected executor acknowledged an empty state. `discovering`: the
/// leader is found again after each failed call (a failover during the wait).
pub async fn teardown(sources: &Sources, discovering: bool, wait: Duration, undo: bool) -> Result<String, CtlError> {
    let config = kube_config(sources).await?;
    let client = kube::Client::try_from(config).map_err(|e| CtlError::Credentials(e.to_string()))?;
    let ns = &sources.namespace;
    let maps: kube::Api<ConfigMap> = kube::Api::namespaced(client, ns);
    let value = if undo { "false" } else { "true" };
    let patch = Patch::Merge(serde_json::json!({ "data": { TEARDOWN_KEY: value } }));
    maps.patch(TEARDOWN_CONFIGMAP, &PatchParams::default(), &patch).await.map_err(|e| {
        CtlError::Call(format!(
            "setting ConfigMap {ns}/{TEARDOWN_CONFIGMAP} {TEARDOWN_KEY}={value}: {e} (the chart installs it: is kuport \
             installed in namespace {ns} (-n)?)"
        ))
    })?;
    if undo {
        return Ok(format!(
            "teardown withdrawn (ConfigMap {ns}/{TEARDOWN_CONFIGMAP}): the controller computes every node's state again\n"
        ));
    }
    // Done early when every node is empty. A node without an executor may be one that
    // reconnects to a new leader, so it is waited for too; at the deadline it is only named.
    let deadline = tokio::time::Instant::now() + wait;
    let mut last_error = None;
    let mut progress: Option<Progress> = None;
    loop {
        match list_nodes(sources, discovering).await {
            Ok(r) if !r.leader => last_error = Some(CtlError::Call("a follower answered, not the leader".into())),
            Ok(r) if r.nodes.is_empty() => last_error = Some(CtlError::Call("the leader lists no node yet".into())),
            Ok(r) => {
                let p = Progress::of(&r);
                if p.waiting.is_empty() && p.absent.is_empty() {
                    return Ok(format!("teardown asked (ConfigMap {ns}/{TEARDOWN_CONFIGMAP}):\n{}", p.text()));
                }
                progress = Some(p);
            }
            Err(e) => last_error = Some(e),
        }
        if tokio::time::Instant::now() >= deadline {
            return match progress {
                Some(p) if p.waiting.is_empty() => {
                    Ok(format!("teardown asked (ConfigMap {ns}/{TEARDOWN_CONFIGMAP}):\n{}", p.text()))
                }
                p => {
                    let mut t = format!("teardown: not every connected node acknowledged an empty state in {wait:?}");
                    if let Some(p) = p {
                        let _ = write!(t, ":\n{}", p.text().trim_end());
                    }
                    if let Some(e) = last_error {
                        let _ = write!(t, "\nthe last call: {e}");
                    }
                    Err(CtlError::Call(t))
                }
            };
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One ListNodes, on a fresh connection to the leader (found again when `discovering`).
async fn list_nodes(sources: &Sources, discovering: bool) -> Result<ListNodesResponse, CtlError> {
    let mut sources = sources.clone();
    if discovering {
        sources.controller = discover(&sources).await?;
    }
    let credentials = credentials(&sources).await?;
    let mut client = connect_with(&sources.controller, &credentials).await?;
    Ok(client.list_nodes(ListNodesRequest {}).await.map_err(call)?.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kuport_proto::v1::NodeDebug;

    fn node(name: &str, connected: bool, desired: &str, acked: &str) -> NodeDebug {
        NodeDebug {
            node: name.into(),
            connected,
            desired_version: desired.into(),
            acked_version: acked.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_is_empty_only_once_it_acknowledged_the_empty_state_of_its_own_name() {
        let empty = |n: &str| kuport_proto::canonical_version(&NodeState { node: n.into(), ..Default::default() });
        let r = ListNodesResponse {
            nodes: vec![
                node("a", true, &empty("a"), &empty("a")),
                // Desired empty, the old state still applied.
                node("b", true, &empty("b"), "v1"),
                // Another node's empty version is not this one's.
                node("c", true, &empty("a"), &empty("a")),
                node("d", false, &empty("d"), "v1"),
                node("e", false, &empty("e"), &empty("e")),
            ],
            ..Default::default()
        };
        let p = Progress::of(&r);
        assert_eq!(p.empty, ["a", "e"]);
        assert_eq!(p.waiting, ["b", "c"]);
        assert_eq!(p.absent, ["d"]);
    }
}
