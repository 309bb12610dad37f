//! Indexes over an observed [`Cluster`]: what the computation reads, in the shapes it reads them
//! (nodes with their facts, Services and their slices, classes by name), built once per compute.

use std::cell::{OnceCell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::rc::Rc;
use std::sync::Arc;

use ipnet::Ipv4Net;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::facts::{self, Refused};
use super::{Change, Cluster, KnownFacts, Objects};
use crate::api::{PortMapClass, PortMapClassStatus};
use crate::compute::Shared;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// A link's MTU when neither end has reported its underlay yet: Ethernet's 1500.
pub const DEFAULT_UNDERLAY_MTU: u32 = 1500;

/// What the computation knows of one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KnownNode {
    pub exists: bool,
    pub ready: bool,
    /// The executor's underlay address, else the Node's InternalIP, else a class status row's;
    /// None when it clashes with another node's ([`facts::underlays`]).
    pub underlay: Option<Ipv4Addr>,
    /// The executor's underlay MTU (unless its address was refused), else a class status row's.
    pub underlay_mtu: Option<u32>,
    /// What of the executor's reports was refused, and why: the class status says it.
    pub refused: Vec<Refused>,
    /// Interface names and addresses, when the executor has reported them.
    pub interfaces: Option<BTreeMap<String, Vec<String>>>,
    /// Addresses of class interfaces as class status rows remember them: what
    /// [`KnownNode::addresses_of`] answers until the executor reports, so a new leader
    /// publishes the same addresses as the old one.
    pub remembered: BTreeMap<String, Vec<String>>,
    /// Class interfaces the rows say the node has (true) or lacks (false), for the same reason.
    pub remembered_interfaces: BTreeMap<String, bool>,
    /// The node's overlay address and device MTU when it is a mesh member with an address:
    /// links between two members ride on the mesh (docs/overlay/mesh.md, "Port maps over the mesh").
    pub overlay: Option<(Ipv4Addr, u32)>,
    /// The main table's IPv4 routes (prefix, device) as the executor reported them; None
    /// until it has. Which device reaches a local pod ([`KnownNode::route_to`]).
    pub routes: Option<Vec<(Ipv4Net, String)>>,
    /// The UDP ports of the node's VXLAN devices that are not kuport's (the CNI's).
    pub vxlan_ports: Vec<u16>,
}

/// How a node's kernel reaches an address, from its reported routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteTo {
    /// Through this device: the longest reported prefix that contains the address.
    Device(String),
    /// The address is the node's own (a host-network pod): delivered locally, it leaves by no
    /// device.
    Local,
    /// No reported route contains it, or the node has not reported its routes yet.
    Unknown,
}

impl KnownNode {
    /// How the node's kernel reaches `addr` (docs/portmap/datapath.md, "The request claim").
    pub fn route_to(&self, addr: Ipv4Addr) -> RouteTo {
        let text = addr.to_string();
        if self.interfaces.as_ref().is_some_and(|m| m.values().any(|a| a.contains(&text))) {
            return RouteTo::Local;
        }
        longest_prefix(self.routes.as_deref().unwrap_or_default(), addr)
            .map_or(RouteTo::Unknown, |dev| RouteTo::Device(dev.to_string()))
    }

    /// Whether `iface` may exist: unknown until the executor reports.
    pub fn may_have(&self, iface: &str) -> bool {
        match &self.interfaces {
            Some(m) => m.contains_key(iface),
            None => self.remembered_interfaces.get(iface).copied().unwrap_or(true),
        }
    }

    /// Of `class_interfaces`, those the node is known to have: None while unknown.
    pub fn known_interfaces(&self, class_interfaces: &[String]) -> Option<Vec<String>> {
        let known = match &self.interfaces {
            Some(m) => class_interfaces.iter().filter(|i| m.contains_key(*i)).cloned().collect(),
            None if class_interfaces.iter().all(|i| self.remembered_interfaces.contains_key(i)) => {
                class_interfaces.iter().filter(|i| self.remembered_interfaces[*i]).cloned().collect()
            }
            None => return None,
        };
        Some(known)
    }

    pub fn addresses_of(&self, iface: &str) -> &[String] {
        match &self.interfaces {
            Some(m) => m.get(iface).map(Vec::as_slice).unwrap_or(&[]),
            None => self.remembered.get(iface).map(Vec::as_slice).unwrap_or(&[]),
        }
    }

    /// The underlay MTU this node's links start from.
    pub fn mtu(&self) -> u32 {
        self.underlay_mtu.unwrap_or(DEFAULT_UNDERLAY_MTU)
    }
}

static UNKNOWN_NODE: KnownNode = KnownNode {
    exists: false,
    ready: false,
    underlay: None,
    underlay_mtu: None,
    interfaces: None,
    remembered: BTreeMap::new(),
    remembered_interfaces: BTreeMap::new(),
    refused: Vec::new(),
    overlay: None,
    routes: None,
    vxlan_ports: Vec::new(),
};

/// What vouching reads of a Pod: its node and current addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownPod<'a> {
    pub name: &'a str,
    pub node: Option<&'a str>,
    pub ips: Vec<IpAddr>,
}

impl<'a> KnownPod<'a> {
    fn of(p: &'a Pod) -> Self {
        let status = p.status.as_ref();
        let ips = status.iter().flat_map(|s| s.pod_ips.iter().flatten()).map(|i| i.ip.as_str());
        let ips = ips.chain(status.and_then(|s| s.pod_ip.as_deref())).filter_map(|a| a.parse().ok());
        let mut ips: Vec<IpAddr> = ips.collect();
        ips.sort();
        ips.dedup();
        KnownPod {
            name: p.metadata.name.as_deref().unwrap_or_default(),
            node: p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            ips,
        }
    }
}

/// The Pods of a cluster as placement reads them, each namespace's read when first asked.
struct Pods<'a> {
    named: &'a Named<Pod>,
    /// Each namespace's Pods by name, as read so far.
    known: RefCell<HashMap<&'a str, Rc<BTreeMap<&'a str, KnownPod<'a>>>>>,
    /// Every address some Pod holds.
    addresses: OnceCell<BTreeSet<IpAddr>>,
}

impl<'a> Pods<'a> {
    /// The Pods of namespace `ns` by name (of two with one name, the later).
    fn of(&self, ns: &str) -> Rc<BTreeMap<&'a str, KnownPod<'a>>> {
        if let Some(known) = self.known.borrow().get(ns) {
            return known.clone();
        }
        let Some((ns, pods)) = self.named.namespace(ns) else { return Rc::default() };
        let known: BTreeMap<&str, KnownPod> = pods.iter().map(|(name, p)| (name.as_str(), KnownPod::of(p))).collect();
        let known = Rc::new(known);
        self.known.borrow_mut().insert(ns, known.clone());
        known
    }
}

/// Objects of one kind by namespace and name (of two with one name, the later in the list),
/// kept from one compute to the next and edited by the objects that changed
/// ([`Named::edited`]): a change costs what it touched.
#[derive(Debug, PartialEq)]
pub struct Named<K> {
    by: Shared<String, Shared<String, Arc<K>>>,
    /// Two objects share a name (a folder's): which one counts follows the list's order, so
    /// the index is made anew for every change.
    twice: bool,
}

impl<K> Clone for Named<K> {
    fn clone(&self) -> Self {
        Named { by: self.by.clone(), twice: self.twice }
    }
}

impl<K> Default for Named<K> {
    fn default() -> Self {
        Named { by: Shared::new(), twice: false }
    }
}

impl<K: kube::Resource + PartialEq> Named<K> {
    pub fn of(objects: &Objects<K>) -> Self {
        let mut named = Named::default();
        for o in objects.arcs() {
            if let Some((ns, name)) = named_key(&**o) {
                named.twice |= named.by.entry(ns).or_default().insert(name, o.clone()).is_some();
            }
        }
        named
    }

    /// This index, made for the objects before `changes` ([`Objects::changes`]), made for
    /// `new`, the objects after.
    pub fn edited(&self, new: &Objects<K>, changes: &[Change<K>]) -> Self {
        self.edit(changes).unwrap_or_else(|| Named::of(new))
    }

    fn edit(&self, changes: &[Change<K>]) -> Option<Self> {
        if self.twice {
            return None;
        }
        let mut next = self.clone();
        for change in changes {
            let (a, b) = match *change {
                (None, None) => return None,
                (a, b) => (a, b),
            };
            if let Some((ns, name)) = a.and_then(|a| named_key(&**a)) {
                let names = next.by.get_mut(&ns)?;
                names.remove(&name)?;
                if names.is_empty() {
                    next.by.remove(&ns);
                }
            }
            if let Some(((ns, name), b)) = b.and_then(|b| Some((named_key(&**b)?, b))) {
                next.by.entry(ns).or_default().insert(name, b.clone()).is_none().then_some(())?;
            }
        }
        Some(next)
    }

    pub fn get(&self, ns: &str, name: &str) -> Option<&K> {
        self.by.get(ns)?.get(name).map(|o| &**o)
    }

    /// Namespace `ns`, as the index holds it, with its objects by name.
    pub fn namespace(&self, ns: &str) -> Option<(&String, &Shared<String, Arc<K>>)> {
        self.by.get_key_value(ns)
    }

    /// Every object, by namespace and name.
    pub fn iter(&self) -> impl Iterator<Item = &K> {
        self.by.values().flat_map(|names| names.values()).map(|o| &**o)
    }
}

fn named_key<K: kube::Resource>(o: &K) -> Option<(String, String)> {
    Some((o.meta().namespace.clone()?, o.meta().name.clone()?))
}

/// The objects the indexes read that changed between two inputs ([`Objects::changes`]).
pub struct Changed<'a> {
    pub services: Vec<Change<'a, Service>>,
    pub slices: Vec<Change<'a, EndpointSlice>>,
    pub pods: Vec<Change<'a, Pod>>,
}

impl<'a> Changed<'a> {
    pub fn between(old: &'a Cluster, new: &'a Cluster) -> Changed<'a> {
        Changed {
            services: Objects::changes(&old.services, &new.services),
            slices: Objects::changes(&old.endpoint_slices, &new.endpoint_slices),
            pods: Objects::changes(&old.pods, &new.pods),
        }
    }
}

/// What the views of successive computes share: the indexes kept from one to the next.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Indexes {
    pub services: Services,
    pub pods: Named<Pod>,
}

impl Indexes {
    pub fn of(cluster: &Cluster) -> Indexes {
        Indexes { services: Services::of(cluster), pods: Named::of(&cluster.pods) }
    }

    /// These, made for the inputs before `changed`, made for `new`.
    pub fn edited(&self, new: &Cluster, changed: &Changed) -> Indexes {
        Indexes { services: self.services.edited(new, changed), pods: self.pods.edited(&new.pods, &changed.pods) }
    }
}

/// Whether two versions of a Pod read the same to the port maps, which see a Pod only as
/// [`KnownPod`] (its labels, for one, are interception's alone).
pub fn same_for_port_maps(a: &Pod, b: &Pod) -> bool {
    a.metadata.namespace == b.metadata.namespace && KnownPod::of(a) == KnownPod::of(b)
}

/// The device of the longest prefix in `routes` that contains `addr`; of two equal prefixes
/// (a folder's facts are not checked) the first.
pub fn longest_prefix(routes: &[(Ipv4Net, String)], addr: Ipv4Addr) -> Option<&str> {
    let mut best: Option<(u8, &str)> = None;
    for (net, dev) in routes {
        if net.contains(&addr) && best.is_none_or(|(len, _)| net.prefix_len() > len) {
            best = Some((net.prefix_len(), dev));
        }
    }
    best.map(|(_, dev)| dev)
}

/// Services and their EndpointSlices by namespace and name: made once, then kept from one
/// compute to the next and edited by the objects that changed ([`Services::edited`]), so a
/// change costs what it touched.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Services {
    services: Named<Service>,
    /// Slices by namespace and service name, in name order, of every address type: readers
    /// pick theirs by `addressType` (IPv4 for the endpoint, IPv6 for its IPv6 twin).
    slices: Shared<(String, String), Vec<Arc<EndpointSlice>>>,
    /// Two slices of one Service share a name (a folder's): their order is the cluster's, so
    /// these are made anew for every change.
    twice: bool,
}

impl Services {
    /// Every Service and EndpointSlice of `cluster` (of two Services with one name, the later).
    pub fn of(cluster: &Cluster) -> Services {
        let (services, mut twice) = (Named::of(&cluster.services), false);
        let mut slices: BTreeMap<(String, String), Vec<Arc<EndpointSlice>>> = BTreeMap::new();
        for slice in cluster.endpoint_slices.arcs() {
            if let Some(key) = slice_key(slice) {
                slices.entry(key).or_default().push(slice.clone());
            }
        }
        for list in slices.values_mut() {
            list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            twice |= list.windows(2).any(|w| w[0].metadata.name == w[1].metadata.name);
        }
        Services { services, slices: slices.into_iter().collect(), twice }
    }

    /// These, made for the inputs before `changed`, made for `new`; made anew where two slices
    /// share a name.
    pub fn edited(&self, new: &Cluster, changed: &Changed) -> Services {
        self.edit(new, changed).unwrap_or_else(|| Services::of(new))
    }

    fn edit(&self, new: &Cluster, changed: &Changed) -> Option<Services> {
        if self.twice {
            return None;
        }
        let mut next = self.clone();
        next.services = self.services.edited(&new.services, &changed.services);
        for change in &changed.slices {
            let (a, b) = match *change {
                (None, None) => return None,
                (a, b) => (a, b),
            };
            if let Some((key, a)) = a.and_then(|a| Some((slice_key(a)?, a))) {
                let list = next.slices.get_mut(&key)?;
                let at = list.iter().position(|s| s.metadata.name == a.metadata.name)?;
                list.remove(at);
                if list.is_empty() {
                    next.slices.remove(&key);
                }
            }
            if let Some((key, b)) = b.and_then(|b| Some((slice_key(b)?, b))) {
                let list = next.slices.entry(key).or_default();
                // Of two slices with one name, the order is the cluster's: made anew.
                let at = match list.binary_search_by(|s| s.metadata.name.cmp(&b.metadata.name)) {
                    Ok(_) => return None,
                    Err(at) => at,
                };
                list.insert(at, b.clone());
            }
        }
        Some(next)
    }

    /// The Service `ns/name`.
    pub fn service(&self, ns: &str, name: &str) -> Option<&Service> {
        self.services.get(ns, name)
    }

    /// The slices of Service `ns/name`, in name order.
    pub fn slices(&self, ns: &str, name: &str) -> &[Arc<EndpointSlice>] {
        self.slices.get(&(ns.to_string(), name.to_string())).map(Vec::as_slice).unwrap_or_default()
    }
}

fn slice_key(s: &EndpointSlice) -> Option<(String, String)> {
    let svc = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some((s.metadata.namespace.clone()?, svc.clone()))
}

pub struct View<'a> {
    pub nodes: Arc<BTreeMap<String, KnownNode>>,
    pub namespaces: BTreeMap<&'a str, &'a Namespace>,
    pub services: &'a Services,
    pub classes: BTreeMap<String, &'a PortMapClass>,
    /// What vouches for an endpoint (docs/portmap/modes.md, "Which endpoints are believed"),
    /// read on demand: a change places the mappings of a few namespaces.
    pods: Pods<'a>,
    /// UDP ports that carry kuport's VXLAN links: every class's. (The ports a node reports for
    /// its CNI's VXLAN devices are in its [`KnownNode`].)
    pub vxlan_ports: BTreeSet<u16>,
    /// The overlay's WireGuard listen port when the mesh is on: no class publishes it on UDP.
    pub wireguard_port: Option<u16>,
}

impl<'a> View<'a> {
    pub fn new(cluster: &'a Cluster, indexes: &'a Indexes) -> Self {
        View::with_nodes(cluster, Arc::new(known_nodes(cluster)), indexes)
    }

    /// The view of `cluster` whose nodes ([`known_nodes`]) were made already.
    pub fn with_nodes(cluster: &'a Cluster, nodes: Arc<BTreeMap<String, KnownNode>>, indexes: &'a Indexes) -> Self {
        // Keys borrowed from the cluster: a compute reads every object, so no copy per object.
        let namespaces = cluster.namespaces.iter().filter_map(|n| Some((n.metadata.name.as_deref()?, n))).collect();
        let classes = cluster.classes.iter().filter_map(|c| Some((c.metadata.name.clone()?, c))).collect();
        // A node's reported ports bound only that node's mappings (portmap::admission).
        let vxlan_ports = cluster.classes.iter().map(|c| c.spec.return_path.vxlan.port).collect();
        let pods = Pods { named: &indexes.pods, known: RefCell::default(), addresses: OnceCell::new() };
        let services = &indexes.services;
        View { nodes, namespaces, services, classes, pods, vxlan_ports, wireguard_port: None }
    }

    /// Whether some Pod holds `address`: then it is never an external endpoint.
    pub fn is_pod_address(&self, address: &IpAddr) -> bool {
        self.pods
            .addresses
            .get_or_init(|| self.pods.named.iter().flat_map(|p| KnownPod::of(p).ips).collect())
            .contains(address)
    }

    /// The pod of namespace `ns` (named `name`, else any) that holds `address` on `node`; what
    /// is wrong otherwise.
    pub fn pod_holding(&self, ns: &str, name: Option<&str>, node: &str, address: IpAddr) -> Result<&str, String> {
        let pods = self.pods.of(ns);
        let Some(name) = name else {
            return pods
                .values()
                .find(|p| p.node == Some(node) && p.ips.contains(&address))
                .map(|p| p.name)
                .ok_or_else(|| format!("no Pod of namespace {ns} on node {node} has address {address}"));
        };
        let Some(pod) = pods.get(name) else {
            return Err(format!("names Pod {ns}/{name}, which does not exist"));
        };
        if !pod.ips.contains(&address) {
            return Err(format!("names Pod {ns}/{name}, whose status.podIPs do not hold {address}"));
        }
        if pod.node != Some(node) {
            return Err(format!("names Pod {ns}/{name}, which is not on node {node}"));
        }
        Ok(pod.name)
    }

    /// What is known of `name`; an unknown node is neither present nor ready.
    pub fn node(&self, name: &str) -> &KnownNode {
        self.nodes.get(name).unwrap_or(&UNKNOWN_NODE)
    }

    pub fn namespace_labels(&self, ns: &str) -> BTreeMap<String, String> {
        self.namespaces.get(ns).and_then(|n| n.metadata.labels.clone()).unwrap_or_default()
    }
}

/// What the computation knows of each node: its Node, its executor's vouched facts, and the
/// class status rows a previous leader wrote (the fallback for facts no executor has sent yet).
/// Reads no Pod: the mesh needs only this.
pub fn known_nodes(cluster: &Cluster) -> BTreeMap<String, KnownNode> {
    let mut nodes: BTreeMap<String, KnownNode> = BTreeMap::new();
    for node in &cluster.nodes {
        let Some(name) = node.metadata.name.clone() else { continue };
        nodes.insert(
            name,
            KnownNode { exists: true, ready: node_ready(node), underlay: internal_ip(node), ..Default::default() },
        );
    }
    // Rows a previous leader wrote: the fallback for facts no executor has sent yet.
    let mut classes: Vec<&PortMapClass> = cluster.classes.iter().collect();
    classes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for class in &classes {
        for row in class.status.iter().flat_map(|s: &PortMapClassStatus| &s.nodes) {
            let view = nodes.entry(row.name.clone()).or_default();
            if view.underlay.is_none() {
                view.underlay = row.underlay_address.as_deref().and_then(|a| a.parse().ok());
            }
            if view.underlay_mtu.is_none() {
                view.underlay_mtu = row.underlay_mtu;
            }
            if let (Some(have), Some(spec)) = (&row.interfaces, class.spec.nodes.get(&row.name)) {
                for i in &spec.interfaces {
                    view.remembered_interfaces.insert(i.clone(), have.contains(i));
                }
            }
            for a in &row.addresses {
                let list = view.remembered.entry(a.interface.clone()).or_default();
                if !list.contains(&a.address) {
                    list.push(a.address.clone());
                }
            }
        }
    }
    // A reported underlay is used only when the Node objects vouch for it; its MTU with it.
    let fallback = nodes.iter().filter_map(|(n, k)| Some((n.clone(), k.underlay?))).collect();
    let underlays = facts::underlays(&cluster.nodes, &cluster.facts, &fallback);
    let mut facts: Vec<&KnownFacts> = cluster.facts.iter().collect();
    facts.sort_by(|a, b| a.node.cmp(&b.node));
    for f in facts {
        let view = nodes.entry(f.node.clone()).or_default();
        let vouched = f.underlay_address.is_none() || underlays.get(&f.node).is_some_and(|u| u.reported);
        if let Some(m) = f.underlay_mtu
            && vouched
        {
            view.underlay_mtu = Some(m);
        }
        if let Some(ifaces) = &f.interfaces {
            view.interfaces = Some(ifaces.iter().map(|i| (i.name.clone(), i.addresses.clone())).collect());
        }
        if let Some(routes) = &f.routes {
            // IPv4 only for now; a prefix that does not parse (a folder's facts) is skipped.
            view.routes = Some(routes.iter().filter_map(|r| Some((r.dst.parse().ok()?, r.dev.clone()))).collect());
        }
        view.vxlan_ports = f.vxlan_ports.clone();
    }
    for (name, u) in underlays {
        let view = nodes.entry(name).or_default();
        view.underlay = u.address;
        view.refused.extend(u.refused);
    }
    for (name, r) in &cluster.refused_facts {
        nodes.entry(name.clone()).or_default().refused.push(r.clone());
    }
    nodes
}

/// What the computation reads of a Node besides its name: readiness, the InternalIP, every
/// address with its type (an executor's underlay must be one; the overlay's endpoint is the
/// ExternalIP, else the InternalIP), the pod CIDRs and the overlay's endpoint annotation, and
/// the overlay's published annotations. A watch that sees none change (a kubelet heartbeat)
/// need not recompute.
pub fn node_inputs(node: &Node) -> NodeInputs<'_> {
    let typed = node.status.iter().flat_map(|s| s.addresses.iter().flatten()).map(|a| (&*a.type_, &*a.address));
    let spec = node.spec.as_ref();
    (
        (node_ready(node), internal_ip(node), facts::node_addresses(node)),
        typed.collect(),
        (
            spec.and_then(|s| s.pod_cidrs.as_deref()),
            spec.and_then(|s| s.pod_cidr.as_deref()),
            node.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::compute::overlay::EXTERNAL_ENDPOINT_ANNOTATION)),
        ),
        // Who may relay (docs/overlay/relays.md).
        // And who holds which key (docs/overlay/mesh.md).
        [
            crate::compute::overlay::relays::CONTROL_PLANE_LABEL,
            crate::compute::overlay::relays::RELAY_LABEL,
            crate::compute::overlay::KEY_HELD_LABEL,
        ]
        .map(|k| node.metadata.labels.as_ref().and_then(|l| l.get(k))),
        // Not read by the computation: a change (someone removed them) wakes the status
        // writer, which puts back what it publishes.
        crate::compute::overlay::WRITTEN_ANNOTATIONS.map(|k| node.metadata.annotations.as_ref().and_then(|a| a.get(k))),
    )
}

/// See [`node_inputs`].
pub type NodeInputs<'a> = (
    (bool, Option<Ipv4Addr>, Vec<Ipv4Addr>),
    Vec<(&'a str, &'a str)>,
    (Option<&'a [String]>, Option<&'a str>, Option<&'a String>),
    [Option<&'a String>; 3],
    [Option<&'a String>; 4],
);

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn internal_ip(node: &Node) -> Option<Ipv4Addr> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse().ok())
}

/// Whether `labels` satisfy `selector`, with Kubernetes' semantics. An unknown operator selects
/// nothing, so a typo narrows access instead of widening it.
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_match = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let exprs_match = selector.match_expressions.iter().flatten().all(|e| {
        let values: BTreeSet<&String> = e.values.iter().flatten().collect();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_match && exprs_match
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each change, edited into the indexes of the cluster before, gives the indexes made anew:
    /// Services, slices and Pods that come, go, move to another Service, name or namespace, and
    /// two of one name.
    #[test]
    fn indexes_edited_equal_indexes_made_anew() {
        use crate::compute::testkit::World;
        fn label(s: &mut EndpointSlice, to: &str) {
            s.metadata.labels.get_or_insert_default().insert(SERVICE_NAME_LABEL.into(), to.into());
        }
        let eps = |ip: &'static str| [("p-0", "n1", ip, true)];
        let mut c = World::new()
            .service("a", "web", "TCP", 80, &eps("10.0.0.1"))
            .service("a", "db", "TCP", 5432, &[("p-1", "n1", "10.0.0.2", true)])
            .service("b", "web", "TCP", 80, &eps("10.0.1.1"))
            .cluster();
        type Change = (&'static str, fn(&mut Cluster));
        let changes: [Change; 15] = [
            ("a Service goes", |c| c.services.retain(|s| s.metadata.name.as_deref() != Some("db"))),
            ("a Service is renamed", |c| c.services[0].metadata.name = Some("www".into())),
            ("a slice moves to another Service", |c| label(&mut c.endpoint_slices[0], "db")),
            ("a second slice of one Service", |c| {
                let mut s = c.endpoint_slices[1].clone();
                s.metadata.name = Some("db-y".into());
                c.endpoint_slices.push(s);
            }),
            ("a slice is renamed, before the other", |c| c.endpoint_slices[3].metadata.name = Some("a-y".into())),
            ("the lists are reordered", |c| {
                let s = c.endpoint_slices.remove(0);
                c.endpoint_slices.push(s);
                let p = c.pods.remove(0);
                c.pods.push(p);
            }),
            ("a Pod moves to another namespace", |c| c.pods[0].metadata.namespace = Some("c".into())),
            ("a Pod is renamed", |c| c.pods[1].metadata.name = Some("p-9".into())),
            ("two Services of one name", |c| {
                let s = c.services[0].clone();
                c.services.push(s);
            }),
            ("one of them goes", |c| {
                c.services.remove(0);
            }),
            ("two slices of one name", |c| {
                let s = c.endpoint_slices[0].clone();
                c.endpoint_slices.push(s);
            }),
            ("one of them goes", |c| {
                c.endpoint_slices.pop();
            }),
            ("two Pods of one name", |c| {
                let p = c.pods[0].clone();
                c.pods.push(p);
            }),
            ("one of them goes", |c| {
                c.pods.pop();
            }),
            ("a slice and a Pod go", |c| {
                c.endpoint_slices.remove(0);
                c.pods.remove(0);
            }),
        ];
        let mut indexes = Indexes::of(&c);
        for (what, change) in changes {
            let before = c.clone();
            change(&mut c);
            indexes = indexes.edited(&c, &Changed::between(&before, &c));
            assert_eq!(indexes, Indexes::of(&c), "{what}");
        }
    }

    fn routes(list: &[(&str, &str)]) -> Vec<(Ipv4Net, String)> {
        list.iter().map(|(d, v)| (d.parse().expect("prefix"), (*v).to_string())).collect()
    }

    #[test]
    fn the_longest_prefix_containing_the_address_wins() {
        let r = routes(&[
            ("10.0.0.0/8", "eth0"),
            ("10.244.1.7/32", "cali1"),
            ("10.244.0.0/16", "cilium_host"),
            ("10.244.1.0/24", "cni0"),
        ]);
        let at = |a: &str| longest_prefix(&r, a.parse().expect("address"));
        assert_eq!(at("10.244.1.7"), Some("cali1"));
        assert_eq!(at("10.244.1.8"), Some("cni0"));
        assert_eq!(at("10.244.2.8"), Some("cilium_host"));
        assert_eq!(at("10.9.0.1"), Some("eth0"));
        assert_eq!(at("192.0.2.1"), None);
        // Order does not matter.
        let mut rev = r.clone();
        rev.reverse();
        assert_eq!(longest_prefix(&rev, "10.244.1.8".parse().expect("address")), Some("cni0"));
        assert_eq!(longest_prefix(&[], "10.244.1.8".parse().expect("address")), None);
    }

    #[test]
    fn a_node_routes_its_own_address_locally_and_unknown_without_routes() {
        let mut n = KnownNode::default();
        let pod: Ipv4Addr = "10.244.1.7".parse().expect("address");
        assert_eq!(n.route_to(pod), RouteTo::Unknown);
        n.routes = Some(routes(&[("10.244.1.0/24", "cni0")]));
        assert_eq!(n.route_to(pod), RouteTo::Device("cni0".into()));
        n.interfaces = Some(BTreeMap::from([("cni0".to_string(), vec!["10.244.1.7".to_string()])]));
        assert_eq!(n.route_to(pod), RouteTo::Local);
    }
}
