//! Accepted: whether a PortMap may publish what it asks for, before any pod is looked at.
//!
//! Mappings are judged in order of age (creationTimestamp, then namespace/name), so an older
//! mapping that works is never displaced by a newer one that collides with it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use ipnet::IpNet;

use super::status::{Refusal, reason};
use crate::api::{DEFAULT_MIN_PORT, PortMap, PortMapClass, Protocol};
use crate::observe::Objects;
use crate::observe::index::{View, selects};

/// A PortMap's namespace and name.
pub type MapKey = (String, String);

/// A mapping that passed every Accepted check: its objects, and what was checked of them.
#[derive(Clone, Debug)]
pub struct Admitted<'a> {
    pub pm: &'a PortMap,
    pub class: &'a PortMapClass,
    /// Shared with the next compute, which takes it while nothing admission reads changed.
    pub accepted: Arc<Accepted>,
}

impl std::ops::Deref for Admitted<'_> {
    type Target = Accepted;
    fn deref(&self) -> &Accepted {
        &self.accepted
    }
}

/// What the Accepted checks found of a mapping.
#[derive(Debug)]
pub struct Accepted {
    pub key: MapKey,
    pub class_name: String,
    pub protocol: Protocol,
    /// Inclusive published ports.
    pub ports: (u16, u16),
    /// The class's accepting nodes with the interfaces this mapping uses there (never empty).
    pub accepting: BTreeMap<String, Vec<String>>,
    /// The clients that may reach the mapping (docs/portmap/guard.md); None lets every one in.
    pub source_ranges: Option<Vec<IpNet>>,
    /// The per-source bounds (docs/portmap/guard.md, "Rate limits"); None: unbounded.
    pub rate_limit: Option<SourceLimit>,
}

/// A mapping's per-source bounds, checked: new connections per second with their burst, and
/// the connections one client may hold (None: unbounded).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceLimit {
    pub per_second: u32,
    pub burst: u32,
    pub connections: Option<u32>,
}

impl Accepted {
    pub fn is_range(&self) -> bool {
        self.ports.0 != self.ports.1
    }

    fn port_count(&self) -> u32 {
        u32::from(self.ports.1 - self.ports.0) + 1
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

/// The ports a node needs for itself, which no class publishes whatever its range
/// (docs/portmap/modes.md, "Ports no class publishes"): protocol, first and last port, whose.
/// Besides these: every class's VXLAN port and every CNI VXLAN port a node reports (UDP), and the
/// overlay's WireGuard listen port (UDP), see [`reserved_for_node`].
pub const NODE_PORTS: &[(Protocol, u16, u16, &str)] = &[
    (Protocol::Tcp, 2379, 2380, "etcd's client and peer ports"),
    (Protocol::Tcp, 6443, 6443, "the Kubernetes API server's port"),
    (Protocol::Tcp, 9090, 9090, "kuport's controller metrics port (the chart's default)"),
    (Protocol::Tcp, 9443, 9443, "kuport's controller gRPC port (the chart's default)"),
    (Protocol::Tcp, 10248, 10248, "the kubelet's healthz port"),
    (Protocol::Tcp, 10249, 10249, "kube-proxy's metrics port"),
    (Protocol::Tcp, 10250, 10250, "the kubelet's API port"),
    (Protocol::Tcp, 10255, 10255, "the kubelet's read-only port"),
    (Protocol::Tcp, 10256, 10256, "kube-proxy's health check port"),
    (Protocol::Tcp, 10257, 10257, "kube-controller-manager's port"),
    (Protocol::Tcp, 10259, 10259, "kube-scheduler's port"),
    (Protocol::Udp, 51820, 51820, "WireGuard's default listen port (kuport's overlay or the nodes' own mesh)"),
];

/// The first port of `first..=last` a node keeps for itself under `protocol`, and why.
fn reserved_for_node(view: &View, protocol: Protocol, (first, last): (u16, u16)) -> Option<(u16, String)> {
    let fixed = NODE_PORTS
        .iter()
        .filter(|(p, a, b, _)| *p == protocol && *a <= last && first <= *b)
        .map(|(_, a, _, why)| ((*a).max(first), why.to_string()));
    let udp = protocol == Protocol::Udp;
    let vxlan = view
        .vxlan_ports
        .iter()
        .filter(|p| udp && (first..=last).contains(*p))
        .map(|p| (*p, "a VXLAN port of kuport's links".to_string()));
    let wireguard = view
        .wireguard_port
        .filter(|p| udp && (first..=last).contains(p))
        .map(|p| (p, "the overlay's WireGuard listen port".to_string()));
    fixed.chain(vxlan).chain(wireguard).min_by_key(|(p, _)| *p)
}

/// What one namespace already holds in one class: PortMaps and ports.
type Held = BTreeMap<(String, String), (u32, u32)>;

/// One mapping judged: its key, its PortMap, and the verdict.
pub type Verdict<'a> = (MapKey, &'a PortMap, Result<Admitted<'a>, Refusal>);

/// Every mapping's verdict, owned, in the order judged, and the ports and bounds the accepted
/// ones hold after the last: what the next compute judges a change against.
#[derive(Default)]
pub struct Verdicts {
    judged: Vec<Entry>,
    claims: Claims,
    held: Held,
}

/// One mapping judged, owned.
#[derive(Clone)]
struct Entry {
    /// The PortMap's place in the list it was judged from.
    at: usize,
    key: MapKey,
    /// What its own checks found, before its namespace's bounds and the older mappings' ports.
    checked: Result<Arc<Accepted>, Refusal>,
    /// Why its namespace's bounds or an older mapping refused it, when its own checks passed.
    refused: Option<Refusal>,
}

impl Entry {
    fn verdict(&self) -> Result<&Arc<Accepted>, &Refusal> {
        match (&self.checked, &self.refused) {
            (Ok(a), None) => Ok(a),
            (Ok(_), Some(r)) | (Err(r), _) => Err(r),
        }
    }

    fn owned(&self) -> Result<Arc<Accepted>, Refusal> {
        self.verdict().cloned().map_err(Refusal::clone)
    }
}

/// Judges every mapping, oldest first. The result is in that order, with its owned copy.
pub fn admit<'a>(view: &View<'a>, port_maps: &'a Objects<PortMap>) -> (Vec<Verdict<'a>>, Verdicts) {
    let mut ordered: Vec<usize> = (0..port_maps.len()).collect();
    ordered.sort_by_cached_key(|i| age_order(&port_maps[*i]));
    let mut owned = Verdicts { judged: Vec::with_capacity(ordered.len()), ..Verdicts::default() };
    let verdicts = ordered
        .into_iter()
        .map(|i| {
            let pm = &port_maps[i];
            let key = key_of(pm);
            let (checked, refused, verdict) = match check(view, pm) {
                Err(r) => (Err(r.clone()), None, Err(r)),
                Ok(a) => match owned.judge(a.class, &a.accepted) {
                    Ok(()) => (Ok(a.accepted.clone()), None, Ok(a)),
                    Err(r) => (Ok(a.accepted.clone()), Some(r.clone()), Err(r)),
                },
            };
            owned.judged.push(Entry { at: i, key: key.clone(), checked, refused });
            (key, pm, verdict)
        })
        .collect();
    (verdicts, owned)
}

/// The verdicts `before`, taken for `port_maps` when nothing admission reads changed since
/// (every PortMap's spec and age, every class's spec, the Namespaces, the nodes): None when
/// the list does not hold the same PortMaps in the same places, or a class is gone.
pub fn readmit<'a>(view: &View<'a>, port_maps: &'a Objects<PortMap>, before: &Verdicts) -> Option<Vec<Verdict<'a>>> {
    if before.judged.len() != port_maps.len() {
        return None;
    }
    before
        .judged
        .iter()
        .map(|e| {
            let pm = &**port_maps.get(e.at)?;
            let (ns, name) = (pm.metadata.namespace.as_deref().unwrap_or_default(), pm.metadata.name.as_deref());
            if ns != e.key.0 || name.unwrap_or_default() != e.key.1 {
                return None;
            }
            Some((e.key.clone(), pm, admitted(view, pm, e.verdict())?))
        })
        .collect()
}

fn admitted<'a>(
    view: &View<'a>,
    pm: &'a PortMap,
    verdict: Result<&Arc<Accepted>, &Refusal>,
) -> Option<Result<Admitted<'a>, Refusal>> {
    Some(match verdict {
        Ok(a) => Ok(Admitted { pm, class: view.classes.get(&a.class_name).copied()?, accepted: a.clone() }),
        Err(r) => Err(r.clone()),
    })
}

/// The verdicts for `port_maps` judged by change from `before` ([`readmit_changed`]).
pub struct Readmitted<'a> {
    pub verdicts: Vec<Verdict<'a>>,
    pub owned: Verdicts,
    /// The verdicts before of the changed mappings and of those whose verdict is another now.
    pub moved: HashMap<MapKey, Result<Arc<Accepted>, Refusal>>,
    /// The mappings gone (in `moved` too).
    pub gone: Vec<MapKey>,
}

/// The verdicts for `port_maps` where what admission reads changed only in the PortMaps
/// `changed` (come, gone, or with another spec or age). A mapping's verdict reads only the
/// older ones': the verdicts before the first place in age order a change reaches stay, and
/// from there on every mapping is judged again (its own checks taken from before where its
/// PortMap is the same) against what the older ones hold. None where a PortMap's name is in
/// the list twice, or a class is gone.
pub fn readmit_changed<'a>(
    view: &View<'a>,
    port_maps: &'a Objects<PortMap>,
    before: &Verdicts,
    changed: &BTreeSet<MapKey>,
) -> Option<Readmitted<'a>> {
    let mut place: HashMap<(&str, &str), usize> = HashMap::with_capacity(port_maps.len());
    for (i, pm) in port_maps.iter().enumerate() {
        let m = &pm.metadata;
        let key = (m.namespace.as_deref().unwrap_or_default(), m.name.as_deref().unwrap_or_default());
        if place.insert(key, i).is_some() {
            return None;
        }
    }
    let place_of = |k: &MapKey| place.get(&(k.0.as_str(), k.1.as_str())).copied();
    let age = |i: usize| {
        let m = &port_maps[i].metadata;
        (m.creation_timestamp.as_ref().map(|t| t.0), m.namespace.as_deref(), m.name.as_deref())
    };
    // The changed PortMaps there now, oldest first, merged into the order before.
    let mut fresh: Vec<usize> = changed.iter().filter_map(place_of).collect();
    fresh.sort_by_key(|i| age(*i));
    let mut fresh = fresh.into_iter().peekable();
    let mut order: Vec<Result<(usize, &Entry), usize>> = Vec::with_capacity(port_maps.len());
    let (mut moved, mut gone) = (HashMap::new(), Vec::new());
    let mut first_changed = None;
    for (n, e) in before.judged.iter().enumerate() {
        if changed.contains(&e.key) {
            first_changed.get_or_insert(n);
            moved.insert(e.key.clone(), e.owned());
            if place_of(&e.key).is_none() {
                gone.push(e.key.clone());
            }
            continue;
        }
        let at = place_of(&e.key)?;
        while let Some(i) = fresh.next_if(|i| age(*i) < age(at)) {
            order.push(Err(i));
        }
        order.push(Ok((at, e)));
    }
    order.extend(fresh.map(Err));
    // Before `from`, the order and the verdicts are the ones before.
    let first_fresh = order.iter().position(Result::is_err);
    let from = first_changed.into_iter().chain(first_fresh).min().unwrap_or(order.len());

    let mut owned =
        Verdicts { judged: Vec::with_capacity(order.len()), claims: before.claims.clone(), held: before.held.clone() };
    for a in before.judged.get(from..).unwrap_or_default().iter().filter_map(|e| e.verdict().ok()) {
        owned.release(a);
    }
    let mut verdicts = Vec::with_capacity(order.len());
    for (n, slot) in order.into_iter().enumerate() {
        let entry = match slot {
            Ok((at, e)) if n < from => Entry { at, ..e.clone() },
            Ok((at, e)) => {
                let refused = owned.judge_checked(view, &e.checked)?;
                if refused != e.refused {
                    moved.insert(e.key.clone(), e.owned());
                }
                Entry { at, key: e.key.clone(), checked: e.checked.clone(), refused }
            }
            Err(at) => {
                let pm = &port_maps[at];
                let checked = check(view, pm).map(|a| a.accepted);
                let refused = owned.judge_checked(view, &checked)?;
                Entry { at, key: key_of(pm), checked, refused }
            }
        };
        let pm = &port_maps[entry.at];
        verdicts.push((entry.key.clone(), pm, admitted(view, pm, entry.verdict())?));
        owned.judged.push(entry);
    }
    Some(Readmitted { verdicts, owned, moved, gone })
}

impl Verdicts {
    /// The mapping's namespace's bounds in its class, then the ports older mappings hold:
    /// counted and claimed when it passes both.
    fn judge(&mut self, class: &PortMapClass, a: &Arc<Accepted>) -> Result<(), Refusal> {
        within_limits(&self.held, class, a)?;
        self.claims.claim(a)?;
        let (maps, used) = self.held.entry((a.class_name.clone(), a.key.0.clone())).or_default();
        *maps += 1;
        *used = used.saturating_add(a.port_count());
        Ok(())
    }

    /// [`Verdicts::judge`] for a mapping whose own checks passed: why it is refused, if it is.
    /// None where its class is gone.
    fn judge_checked(&mut self, view: &View, checked: &Result<Arc<Accepted>, Refusal>) -> Option<Option<Refusal>> {
        Some(match checked {
            Ok(a) => self.judge(view.classes.get(&a.class_name).copied()?, a).err(),
            Err(_) => None,
        })
    }

    /// What an accepted mapping holds, given back.
    fn release(&mut self, a: &Accepted) {
        self.claims.release(a);
        if let Some((maps, used)) = self.held.get_mut(&(a.class_name.clone(), a.key.0.clone())) {
            *maps = maps.saturating_sub(1);
            *used = used.saturating_sub(a.port_count());
        }
    }
}

/// The class's spec.limits for the mapping's namespace, counting older accepted mappings only
/// (so the oldest keep theirs).
fn within_limits(held: &Held, class: &PortMapClass, a: &Accepted) -> Result<(), Refusal> {
    let ns = &a.key.0;
    let ports = a.port_count();
    let (maps, used) = held.get(&(a.class_name.clone(), ns.clone())).copied().unwrap_or_default();
    if let Some(limits) = &class.spec.limits {
        let class = &a.class_name;
        if let Some(max) = limits.max_port_maps_per_namespace
            && maps >= max
        {
            return Err(Refusal::accepted(
                reason::NAMESPACE_LIMIT_EXCEEDED,
                format!(
                    "namespace {ns:?} already holds {maps} PortMaps of PortMapClass {class:?}, its spec.limits.maxPortMapsPerNamespace"
                ),
            ));
        }
        if let Some(max) = limits.max_ports_per_namespace
            && used.saturating_add(ports) > max
        {
            return Err(Refusal::accepted(
                reason::NAMESPACE_LIMIT_EXCEEDED,
                format!(
                    "spec.port: {ports} more ports would take namespace {ns:?} to {} in PortMapClass {class:?}, above its spec.limits.maxPortsPerNamespace {max}",
                    used.saturating_add(ports)
                ),
            ));
        }
    }
    Ok(())
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
        let low = if first < DEFAULT_MIN_PORT && policy.min >= DEFAULT_MIN_PORT {
            format!("; ports below {DEFAULT_MIN_PORT} are published only when the class names them in spec.ports.min")
        } else {
            String::new()
        };
        return Err(Refusal::accepted(
            reason::PORT_OUTSIDE_CLASS_RANGE,
            format!(
                "spec.port: {} is outside PortMapClass {class_name:?} ports {}-{}{low}",
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
    // What the nodes need for themselves: refused whole, never trimmed (docs/decisions.md,
    // "A PortMap over a node's own ports is refused, not trimmed"). VXLAN is reserved for UDP
    // only: the DNAT matches the protocol, so a TCP mapping never sees a VXLAN datagram.
    if let Some((p, why)) = reserved_for_node(view, spec.protocol, (first, last)) {
        return Err(Refusal::accepted(
            reason::RESERVED_PORT,
            format!(
                "spec.port: {} {} includes {p}, {why}, which no class publishes",
                proto_text(spec.protocol),
                port_text(first, last)
            ),
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
    let source_ranges = source_ranges(class, &class_name, &spec.source_ranges)?;
    let rate_limit = spec.rate_limit.as_ref().map(rate_limit).transpose()?;
    let accepted = Accepted {
        key: key_of(pm),
        class_name,
        protocol: spec.protocol,
        ports: (first, last),
        accepting,
        source_ranges,
        rate_limit,
    };
    Ok(Admitted { pm, class, accepted: Arc::new(accepted) })
}

/// spec.rateLimit checked: every number at least 1 (the CRD says so too; an object from a
/// folder or an older CRD is checked here). The burst defaults to the rate.
fn rate_limit(spec: &crate::api::RateLimit) -> Result<SourceLimit, Refusal> {
    let zero = |field: &str| {
        Refusal::accepted(reason::INVALID_RATE_LIMIT, format!("spec.rateLimit.{field}: 0, where at least 1 is needed"))
    };
    let limit = SourceLimit {
        per_second: spec.new_per_second,
        burst: spec.burst.unwrap_or(spec.new_per_second),
        connections: spec.max_connections,
    };
    match limit {
        SourceLimit { per_second: 0, .. } => Err(zero("newPerSecond")),
        SourceLimit { burst: 0, .. } => Err(zero("burst")),
        SourceLimit { connections: Some(0), .. } => Err(zero("maxConnections")),
        _ => Ok(limit),
    }
}

/// The prefixes a mapping admits clients from (docs/portmap/guard.md): its own, else its
/// class's, host bits cleared; None when both lists are empty. A pinned class takes only
/// prefixes inside its own.
pub(crate) fn source_ranges(
    class: &PortMapClass,
    class_name: &str,
    own: &[String],
) -> Result<Option<Vec<IpNet>>, Refusal> {
    let parse = |list: &[String], field: &str| -> Result<Vec<IpNet>, Refusal> {
        let mut out = Vec::with_capacity(list.len());
        for (i, text) in list.iter().enumerate() {
            let net = text.parse::<IpNet>().map_err(|_| {
                Refusal::accepted(
                    reason::INVALID_SOURCE_RANGE,
                    format!("{field}[{i}]: {text:?} is not a CIDR such as 192.0.2.0/24"),
                )
            })?;
            out.push(net.trunc());
        }
        Ok(out)
    };
    let classes = parse(&class.spec.source_ranges, &format!("PortMapClass {class_name:?} spec.sourceRanges"))?;
    let own = parse(own, "spec.sourceRanges")?;
    if class.spec.pin_source_ranges
        && let Some((i, net)) = own.iter().enumerate().find(|(_, n)| !classes.iter().any(|c| c.contains(*n)))
    {
        return Err(Refusal::accepted(
            reason::SOURCE_RANGE_OUTSIDE_CLASS,
            format!(
                "spec.sourceRanges[{i}]: {net} is not inside PortMapClass {class_name:?} spec.sourceRanges, which the class pins"
            ),
        ));
    }
    let mut chosen = if own.is_empty() { classes } else { own };
    chosen.sort();
    chosen.dedup();
    Ok((!chosen.is_empty()).then_some(chosen))
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

/// Disjoint claimed intervals: first port to the owner (whose last port ends it).
type Intervals = BTreeMap<u16, Arc<Accepted>>;

/// The ports already claimed, bucket by bucket; a copy shares each bucket until it changes.
#[derive(Clone, Default)]
struct Claims {
    buckets: BTreeMap<Bucket, Arc<Intervals>>,
}

impl Claims {
    fn buckets(a: &Accepted) -> Vec<Bucket> {
        let mut buckets = vec![Bucket::Class(a.class_name.clone(), a.protocol)];
        for (node, ifaces) in &a.accepting {
            for iface in ifaces {
                buckets.push(Bucket::Interface { node: node.clone(), iface: iface.clone(), proto: a.protocol });
            }
        }
        buckets
    }

    fn claim(&mut self, a: &Arc<Accepted>) -> Result<(), Refusal> {
        let buckets = Self::buckets(a);
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
            Arc::make_mut(self.buckets.entry(b).or_default()).insert(a.ports.0, a.clone());
        }
        Ok(())
    }

    fn release(&mut self, a: &Accepted) {
        for b in Self::buckets(a) {
            if let Some(intervals) = self.buckets.get_mut(&b)
                && intervals.get(&a.ports.0).is_some_and(|owner| owner.key == a.key)
            {
                Arc::make_mut(intervals).remove(&a.ports.0);
            }
        }
    }

    fn overlap(&self, bucket: &Bucket, (first, last): (u16, u16)) -> Option<MapKey> {
        let intervals = self.buckets.get(bucket)?;
        // Intervals in a bucket are disjoint, so only the last one starting at or before `last`
        // can reach into [first, last].
        let (_, owner) = intervals.range(..=last).next_back()?;
        (owner.ports.1 >= first).then(|| owner.key.clone())
    }
}
