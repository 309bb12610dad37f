//! The in-process datapath driver: compute every node's state from the lab's objects and the
//! user's manifests, and apply each in its node's namespace with the executor, in this process.
//!
//! The fast datapath, lifecycle and ablation tests use it (the ablations edit a computed state
//! before it is applied). `kuport-lab up` and the robustness tests run kuport's real processes
//! instead: a controller and one executor per node, over NodeSync ([`crate::plane`]).

use std::collections::BTreeMap;

use anyhow::bail;
use k8s_openapi::jiff::Timestamp;
use kuport_controller::compute::{Outputs, Settings, compute as compute_outputs};
use kuport_node_exec::executor::Executor;
use kuport_proto::v1::{NetnsState, NodeState};
use std::borrow::Borrow;

use crate::lab::Lab;
use crate::manifests::Manifests;
use crate::sys::netns_path;

/// Computes every node's state and applies it: the lab's datapath follows the manifests.
pub fn program(lab: &mut Lab, manifests: &Manifests) -> anyhow::Result<Outputs> {
    let out = compute(lab, manifests);
    apply(lab, &out.node_states)?;
    Ok(out)
}

/// What the controller would decide for the lab's objects and `manifests`, now. The class
/// statuses of the previous computation are fed back, as the controller's status writes would
/// be, so link slots stay put. Each node's routes and the CNI's VXLAN ports are read from its
/// namespace, as its executor would report them (docs/portmap/datapath.md, "Which device
/// reaches the pod").
pub fn compute(lab: &mut Lab, manifests: &Manifests) -> Outputs {
    let mut cluster = lab.objects().with(&manifests.cluster);
    cluster.now = Timestamp::now();
    for f in &mut cluster.facts {
        let Some(node) = lab.topology().nodes.iter().find(|n| n.name == f.node) else { continue };
        let path = netns_path(&lab.netns_name(&node.name));
        match kuport_node_exec::sync::facts::read(Some(&path), Some(&node.underlay.interface)) {
            Ok(read) => {
                f.routes = Some(
                    read.routes
                        .into_iter()
                        .map(|r| kuport_controller::observe::KnownRoute { dst: r.dst, dev: r.dev })
                        .collect(),
                );
                f.vxlan_ports = read.vxlan_ports.into_iter().filter_map(|p| u16::try_from(p).ok()).collect();
            }
            Err(e) => eprintln!("{}: reading its facts: {e}", f.node),
        }
    }
    for class in &mut cluster.classes {
        let name = class.metadata.name.clone().unwrap_or_default();
        if class.status.is_none()
            && let Some(s) = lab.classes.get(&name)
        {
            class.status = Some(s.clone());
        }
    }
    let out = compute_outputs(&cluster, &Settings::default());
    lab.classes = BTreeMap::clone(&out.classes);
    out
}

/// Applies node states, each in its node's namespace; a node of the lab without a state gets
/// the empty one (kuport's objects removed).
pub fn apply<S: Borrow<NodeState>>(lab: &mut Lab, states: &BTreeMap<String, S>) -> anyhow::Result<()> {
    let mut failures = Vec::new();
    let nodes: Vec<String> = lab.topology().nodes.iter().map(|n| n.name.clone()).collect();
    for name in states.keys().filter(|n| !nodes.contains(n)) {
        // The controller computes states for every node a class names; those outside the lab
        // have no namespace to apply them in.
        let empty =
            states[name].borrow().netns.iter().all(|n| {
                *n == NetnsState { target: n.target.clone(), version: n.version.clone(), ..Default::default() }
            });
        if !empty {
            failures.push(format!("{name}: a state for a node the lab does not have"));
        }
    }
    for node in nodes {
        let path = netns_path(&lab.netns_name(&node));
        let state = states.get(&node).map(|s| s.borrow().clone()).unwrap_or_default();
        let mut host = NetnsState::default();
        for ns in state.netns {
            if ns.is_host() {
                host = ns;
            } else {
                failures.push(format!(
                    "{node}: namespace {}: pod namespaces are not applied by the lab yet",
                    ns.describe()
                ));
            }
        }
        let ex = lab.executors.entry(node.clone()).or_insert_with(|| Executor::new(Some(path)));
        if let Err(e) = ex.apply(&host) {
            failures.push(format!("{node}: {e}"));
        }
    }
    if !failures.is_empty() {
        bail!("applying: {}", failures.join("; "));
    }
    Ok(())
}
