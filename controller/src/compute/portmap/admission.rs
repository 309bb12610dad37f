//! Accepted: whether a PortMap may publish what it asks for, before any pod is looked at.
//!
//! Mappings are judged in order of age (creationTimestamp, then namespace/name), so an older
//! mapping that works is never displaced by a newer one that collides with it.

use std::collections::BTreeMap;

use super::status::{Refusal, reason};
use crate::api::{PortMap, PortMapClass, Protocol};
use crate::observe::index::{View, selects};

/// A PortMap's namespace and name.
pub type MapKey = (String, String);

/// A mapping that passed every Accepted check.
#[derive(Clone, Debug)]
pub struct Admitted<'a> {
    pub key: MapKey,
    pub pm: &'a PortMap,
    pub class_name: String,
    pub class: &'a PortMapClass,
    pub protocol: Protocol,
    /// Inclusive published ports.
    pub ports: (u16, u16),
    /// The class's accepting nodes with the interfaces this mapping uses there (never empty).
    pub accepting: BTreeMap<String, Vec<String>>,
}

impl Admitted<'_> {
    pub fn is_range(&self) -> bool {
        self.ports.0 != self.ports.1
    }
}

/// The order in which mappings claim ports: oldest first.
pub fn age_order(pm: &PortMap) -> (Option<k8s_openapi::jiff::Timestamp>, String, String) {
    (
        pm.metadata.creation_timestamp.as_ref().map(|t| t.0),
        pm.metadata.namespace.clone().unwrap_or_default(),
        pm.metadata.name.clone().unwrap_or_default(),
    )
}

pub fn key_of(pm: &PortMap) -> MapKey {
    (pm.metadata.namespace.clone().unwrap_or_default(), pm.metadata.name.clone().unwrap_or_default())
}

/// Judges every mapping, oldest first. The result is in that order.
pub fn admit<'a>(view: &View<'a>, port_maps: &'a [PortMap]) -> Vec<(MapKey, Result<Admitted<'a>, Refusal>)> {
    let mut ordered: Vec<&PortMap> = port_maps.iter().collect();
    ordered.sort_by_cached_key(|pm| age_order(pm));
    let mut claims = Claims::default();
    ordered
        .into_iter()
        .map(|pm| {
            let key = key_of(pm);
            let verdict = check(view, pm).and_then(|a| {
                claims.claim(&a)?;
                Ok(a)
            });
            (key, verdict)
        })
        .collect()
}

fn check<'a>(view: &View<'a>, pm: &'a PortMap) -> Result<Admitted<'a>, Refusal> {
    let spec = &pm.spec;
    let class_name = spec.class_name.clone();
    let Some(class) = view.classes.get(&class_name).copied() else {
        return Err(Refusal::accepted(
            reason::CLASS_NOT_FOUND,
            format!("spec.className: PortMapClass {class_name:?} does not exist"),
        ));
    };
    let first = spec.port;
    let last = spec.end_port.unwrap_or(first);
    if first == 0 {
        return Err(Refusal::accepted(reason::INVALID_PORT_RANGE, "spec.port: must be between 1 and 65535".into()));
    }
    if last < first {
        return Err(Refusal::accepted(
            reason::INVALID_PORT_RANGE,
            format!("spec.endPort: {last} is below spec.port {first}"),
        ));
    }
    let ns = pm.metadata.namespace.clone().unwrap_or_default();
    if let Some(selector) = &class.spec.namespace_selector
        && !selects(selector, &view.namespace_labels(&ns))
    {
        return Err(Refusal::accepted(
            reason::NAMESPACE_NOT_SELECTED,
            format!("namespace {ns:?} is not selected by PortMapClass {class_name:?} spec.namespaceSelector"),
        ));
    }
    let policy = &class.spec.ports;
    if first < policy.min || last > policy.max {
        return Err(Refusal::accepted(
            reason::PORT_OUTSIDE_CLASS_RANGE,
            format!(
                "spec.port: {} is outside PortMapClass {class_name:?} ports {}-{}",
                port_text(first, last),
                policy.min,
                policy.max
            ),
        ));
    }
    if let Some(r) = policy.reserved.iter().find(|r| (first..=last).contains(r)) {
        return Err(Refusal::accepted(
            reason::RESERVED_PORT,
            format!("spec.port: {r} is reserved by PortMapClass {class_name:?}"),
        ));
    }
    // A UDP mapping over a VXLAN port would swallow the links' own encapsulated traffic.
    if spec.protocol == Protocol::Udp
        && let Some(p) = view.vxlan_ports.iter().find(|p| (first..=last).contains(*p))
    {
        return Err(Refusal::accepted(
            reason::RESERVED_PORT,
            format!("spec.port: UDP {p} carries kuport's VXLAN links"),
        ));
    }
    // A node's CNI VXLAN port (as it reports it) is closed to UDP mappings on that node only.
    let cni_vxlan = |node: &str| {
        let ports = &view.node(node).vxlan_ports;
        ports.iter().copied().find(|p| spec.protocol == Protocol::Udp && (first..=last).contains(p))
    };
    let mut accepting = BTreeMap::new();
    for (node, cn) in &class.spec.nodes {
        let ifaces: Vec<String> = match &spec.interfaces {
            None => cn.interfaces.clone(),
            Some(want) => cn.interfaces.iter().filter(|i| want.contains(i)).cloned().collect(),
        };
        if !ifaces.is_empty() && cni_vxlan(node).is_none() {
            accepting.insert(node.clone(), ifaces);
        }
    }
    if let Some(want) = &spec.interfaces {
        let known = |i: &String| class.spec.nodes.values().any(|n| n.interfaces.contains(i));
        if let Some(bad) = want.iter().find(|i| !known(i)) {
            return Err(Refusal::accepted(
                reason::INTERFACE_NOT_IN_CLASS,
                format!("spec.interfaces: {bad:?} is not an interface of any node in PortMapClass {class_name:?}"),
            ));
        }
    }
    let clashing: Vec<String> =
        class.spec.nodes.keys().filter_map(|n| cni_vxlan(n).map(|p| format!("node {n} (UDP {p})"))).collect();
    if accepting.is_empty() && !clashing.is_empty() {
        return Err(Refusal::accepted(
            reason::RESERVED_PORT,
            format!("spec.port: carries a VXLAN device of the CNI on {}", clashing.join(", ")),
        ));
    }
    if accepting.is_empty() {
        return Err(Refusal::accepted(
            reason::INTERFACE_NOT_IN_CLASS,
            format!("PortMapClass {class_name:?} has no node with the requested interfaces"),
        ));
    }
    Ok(Admitted { key: key_of(pm), pm, class_name, class, protocol: spec.protocol, ports: (first, last), accepting })
}

pub fn port_text(first: u16, last: u16) -> String {
    if first == last { first.to_string() } else { format!("{first}-{last}") }
}

pub fn proto_text(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
    }
}

/// Where published ports must not overlap.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Bucket {
    /// A class's clients dial one port space.
    Class(String, Protocol),
    /// Two classes on one interface share the kernel's DNAT map.
    Interface { node: String, iface: String, proto: Protocol },
}

/// Disjoint claimed intervals: first port to (last port, owner).
type Intervals = BTreeMap<u16, (u16, MapKey)>;

/// The ports already claimed, bucket by bucket.
#[derive(Default)]
struct Claims {
    buckets: BTreeMap<Bucket, Intervals>,
}

impl Claims {
    fn claim(&mut self, a: &Admitted) -> Result<(), Refusal> {
        let mut buckets = vec![Bucket::Class(a.class_name.clone(), a.protocol)];
        for (node, ifaces) in &a.accepting {
            for iface in ifaces {
                buckets.push(Bucket::Interface { node: node.clone(), iface: iface.clone(), proto: a.protocol });
            }
        }
        for b in &buckets {
            if let Some((ns, name)) = self.overlap(b, a.ports) {
                let place = match b {
                    Bucket::Class(class, _) => format!("in PortMapClass {class:?}"),
                    Bucket::Interface { node, iface, .. } => format!("on node {node} interface {iface}"),
                };
                return Err(Refusal::accepted(
                    reason::PORT_CONFLICT,
                    format!(
                        "spec.port: {}/{} {place} is already published by the older PortMap {ns}/{name}",
                        port_text(a.ports.0, a.ports.1),
                        proto_text(a.protocol)
                    ),
                ));
            }
        }
        for b in buckets {
            self.buckets.entry(b).or_default().insert(a.ports.0, (a.ports.1, a.key.clone()));
        }
        Ok(())
    }

    fn overlap(&self, bucket: &Bucket, (first, last): (u16, u16)) -> Option<MapKey> {
        let intervals = self.buckets.get(bucket)?;
        // Intervals in a bucket are disjoint, so only the last one starting at or before `last`
        // can reach into [first, last].
        let (_, (end, owner)) = intervals.range(..=last).next_back()?;
        (*end >= first).then(|| owner.clone())
    }
}
