//! Compute: from what the cluster holds, every node's desired state and every status.
//!
//! Pure: no I/O, no clock (the caller passes `now`), no dependence on input order. Each
//! capability decides its part in a module of its own ([`portmap`] today); what they share is
//! written once: the node-scoped allocator of marks, tables and rule preferences ([`numbers`]),
//! conditions ([`conditions`]), the objects whose status waits on executors ([`Tracked`]), which
//! facts matter ([`relevant_facts`]) and the assembly of each node's state. docs/design.md shows
//! where each rule is decided.

pub mod by_change;
pub mod conditions;
pub mod intercept;
pub mod numbers;
pub mod overlay;
pub mod portmap;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

use std::collections::BTreeMap;
use std::sync::Arc;

use kuport_proto::v1::{NetnsState, NodeState};

use crate::api::{InterceptStatus, PortMapClassStatus, PortMapStatus};
use crate::observe::{Cluster, KnownFacts};
use intercept::pods::InterceptKey;
use portmap::MapKey;

/// Controller settings. Nothing describes the CNI: what the port maps need of it (the device
/// that reaches a local pod, its VXLAN ports) comes from each executor's facts
/// (docs/portmap/datapath.md, "The request claim").
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// The WireGuard mesh, when on (docs/overlay/mesh.md).
    pub overlay: Option<overlay::OverlaySettings>,
}

/// The kinds of object whose status reports what executors did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    PortMap,
    Intercept,
}

/// An object a status is written on, whatever its kind.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: ObjectKind,
    /// Empty for a cluster-scoped object.
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn port_map(namespace: &str, name: &str) -> Self {
        ObjectKey { kind: ObjectKind::PortMap, namespace: namespace.to_string(), name: name.to_string() }
    }

    pub fn intercept(namespace: &str, name: &str) -> Self {
        ObjectKey { kind: ObjectKind::Intercept, namespace: namespace.to_string(), name: name.to_string() }
    }
}

/// What an object's status waits for: the executors that must apply it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tracked {
    /// The nodes whose executors must acknowledge a state holding the object, sorted.
    pub nodes: Vec<String>,
    /// A digest of everything the object's part of those states was computed from: while it
    /// stays the same, so does that part on every node, and a node that acknowledged it once
    /// need not acknowledge it again.
    pub fingerprint: u64,
}

/// A map kept from one compute to the next: a copy costs a pointer, and a change copies only
/// the path to the entries it touched (a persistent B-tree), so a compute that patches a few
/// mappings pays for them, not for the whole map.
pub type Shared<K, V> = imbl::OrdMap<K, V>;

/// Everything the computation decides. Each map is shared with the [`by_change::Computer`]
/// that keeps it for the next compute: a capability not redone costs a pointer, not a copy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outputs {
    pub node_states: BTreeMap<String, Arc<NodeState>>,
    pub port_maps: Shared<MapKey, PortMapStatus>,
    pub classes: Arc<BTreeMap<String, PortMapClassStatus>>,
    /// For each programmed mapping, its programming (accepting) nodes.
    pub programming: Shared<MapKey, Vec<String>>,
    /// Every object placed in node states, with the nodes that must acknowledge it.
    pub tracked: Shared<ObjectKey, Tracked>,
    /// Intercept statuses as if every placed pod were programmed (`intercept::pods::finish`).
    pub intercepts: Arc<BTreeMap<InterceptKey, InterceptStatus>>,
    /// Per Intercept, the pods placed in node states: (pod, node).
    pub intercept_pods: Arc<BTreeMap<InterceptKey, Vec<(String, String)>>>,
    /// Every Node's place in the overlay, with why a node is not in it; empty when it is off.
    /// Each member's lists hold every other member.
    pub overlay: Arc<overlay::Places>,
}

impl Outputs {
    /// The nodes whose executors must apply `key` (none when it is in no node's state).
    pub fn must_ack(&self, key: &ObjectKey) -> &[String] {
        self.tracked.get(key).map(|t| t.nodes.as_slice()).unwrap_or(&[])
    }
}

/// Everything decided for `cluster`, from nothing kept: the reference a
/// [`by_change::Computer`] equals after every change.
pub fn compute(cluster: &Cluster, settings: &Settings) -> Outputs {
    by_change::Computer::new(settings.clone()).compute(cluster)
}

/// Every node's state empty, and nothing placed: the executors remove what kuport made
/// (docs/operations/uninstall.md). Statuses are left as they are.
fn torn_down(cluster: &Cluster) -> Outputs {
    let node_states = cluster
        .nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .map(|node| (node.clone(), Arc::new(NodeState { node, ..Default::default() })))
        .collect();
    Outputs { node_states, ..Default::default() }
}

/// Adds a capability's part of a namespace to what others put there; canonicalize orders it and
/// drops duplicates (two capabilities may both need forwarding). Destructured without `..`, so a
/// new kind of object does not compile until it is merged here.
fn merge(into: &mut NetnsState, part: NetnsState) {
    let NetnsState {
        target: _,
        version: _,
        held: _,
        sysctls,
        nft_tables,
        links,
        addresses,
        routes,
        ip_rules,
        neighbours,
        wireguard_devices,
        delta: _,
    } = part;
    into.sysctls.extend(sysctls);
    // A namespace's one part gives its lists as they are, shared with the part.
    into.nft_tables.append(nft_tables);
    into.links.extend(links);
    into.addresses.extend(addresses);
    into.routes.append(routes);
    into.ip_rules.extend(ip_rules);
    into.neighbours.extend(neighbours);
    into.wireguard_devices.extend(wireguard_devices);
}

/// Keeps the first of two routes with one identity (`kuport_proto::route_identity`) that differ:
/// the executor would refuse the whole state, leaving the node on its last one. Two capabilities
/// placing such routes is a bug in the computation, so it is logged as an error, not refused.
fn drop_route_clashes(node: &str, ns: &mut NetnsState) {
    // Read first: the routes a part shares stay shared when no two share an identity.
    let mut ids: Vec<(u32, &str)> = ns.routes.iter().map(kuport_proto::route_identity).collect();
    ids.sort_unstable();
    if ids.windows(2).all(|w| w[0] != w[1]) {
        return;
    }
    let mut seen: BTreeMap<(u32, String), usize> = BTreeMap::new();
    let mut keep = Vec::with_capacity(ns.routes.len());
    for route in std::mem::take(&mut ns.routes) {
        let (table, dst) = kuport_proto::route_identity(&route);
        match seen.get(&(table, dst.to_owned())) {
            Some(&i) if keep.get(i) != Some(&route) => {
                tracing::error!(node, kept = ?keep.get(i), dropped = ?route, "two routes with one table and destination");
            }
            Some(_) => {}
            None => {
                seen.insert((table, dst.to_owned()), keep.len());
                keep.push(route);
            }
        }
    }
    ns.routes = keep.into();
}

/// Of an executor's reported `facts`, what the computation reads given `inputs`: two reports
/// with the same relevant facts compute the same states and statuses, so only a change in them
/// needs a recompute (a pod's veth coming or going changes neither, nor does a route that
/// contains none of the node's endpoint addresses).
pub fn relevant_facts(inputs: Option<&Cluster>, facts: &KnownFacts) -> KnownFacts {
    let read = portmap::interfaces_read(inputs, &facts.node);
    let interfaces = facts
        .interfaces
        .as_ref()
        .map(|list| list.iter().filter(|i| read.contains(&i.name.as_str())).cloned().collect());
    let routes = match inputs {
        None => facts.routes.clone(),
        Some(cluster) => {
            // The longest prefix containing an address is among the routes that contain it.
            let local: Vec<std::net::Ipv4Addr> = cluster
                .endpoint_slices
                .iter()
                .flat_map(|s| s.endpoints.iter().flatten())
                .filter(|e| e.node_name.as_deref() == Some(facts.node.as_str()))
                .flat_map(|e| e.addresses.iter().filter_map(|a| a.parse().ok()))
                .collect();
            facts.routes.as_ref().map(|list| {
                list.iter()
                    .filter(|r| r.dst.parse::<ipnet::Ipv4Net>().is_ok_and(|n| local.iter().any(|a| n.contains(a))))
                    .cloned()
                    .collect()
            })
        }
    };
    KnownFacts { interfaces, routes, ..facts.clone() }
}

#[cfg(test)]
mod tests {
    use kuport_proto::v1::Route;

    use super::*;

    fn route(dst: &str, via: &str, dev: &str) -> Route {
        Route { table: 201, dst: dst.into(), via: via.into(), dev: dev.into() }
    }

    #[test]
    fn of_two_routes_with_one_identity_the_first_is_kept() {
        let first = route("default", "169.254.77.1", "kup-a");
        let v6 = route("default", "fd00::1", "kup-a");
        let mut ns = NetnsState {
            routes: vec![
                first.clone(),
                v6.clone(),
                route("0.0.0.0/0", "169.254.77.3", "kup-b"),
                first.clone(),
                route("10.0.0.0/24", "", "kup-b"),
            ]
            .into(),
            ..Default::default()
        };
        drop_route_clashes("n1", &mut ns);
        assert_eq!(ns.routes, vec![first, v6, route("10.0.0.0/24", "", "kup-b")]);
    }
}
