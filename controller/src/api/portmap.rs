//! The port-map capability's resources: PortMapClass (which nodes accept, how replies return)
//! and PortMap (one port or range, delivered to one pod behind a Service). docs/portmap/modes.md
//! describes the serving modes and return paths these fields select.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default first VNI of a class: VNI = base + slot.
pub const DEFAULT_VNI_BASE: u32 = 4200;
/// Default UDP port of kuport's VXLAN links: not the port a CNI's VXLAN uses (8472 for Cilium
/// and Flannel, 4789 for Calico).
pub const DEFAULT_VXLAN_PORT: u16 = 4790;
/// Default subnet from which each node pair takes one /31.
pub const DEFAULT_LINK_SUBNET: &str = "169.254.77.0/24";
/// Default IPv6 subnet from which each node pair takes one /127, at the same slot as its /31.
pub const DEFAULT_LINK_SUBNET6: &str = "fd64:f5ac:e961::/112";

/// Which nodes accept a class's traffic and how it is carried to the pod.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "kuport.wlz.li",
    version = "v1alpha1",
    derive = "PartialEq",
    kind = "PortMapClass",
    shortname = "pmc",
    status = "PortMapClassStatus",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.servingMode"}"#,
    printcolumn = r#"{"name":"ReturnPath","type":"string","jsonPath":".spec.returnPath.mode"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("!has(self.pinSourceRanges) || !self.pinSourceRanges || (has(self.sourceRanges) && size(self.sourceRanges) > 0)").message("pinSourceRanges needs sourceRanges: there is no list to pin"))]
#[serde(rename_all = "camelCase")]
pub struct PortMapClassSpec {
    /// The accepting nodes: each key is a Node's name, each value the interfaces where that node
    /// accepts this class's traffic, e.g. `edge-a: {interfaces: [enp1s0, wt0]}`. Only these nodes
    /// publish the class's mappings; a node that is not Ready or lacks every listed interface
    /// serves none of them.
    pub nodes: BTreeMap<String, ClassNode>,
    /// How many accepting nodes carry each mapping. `Single` (default): one serving node, the
    /// pod's node when it accepts, else the first usable accepting node by name. `Multi`: every
    /// usable accepting node, so one routed (anycast) address can reach any of them; each reply
    /// returns through the node its request came in on. See docs/portmap/modes.md.
    #[serde(default)]
    pub serving_mode: ServingMode,
    /// The ports mappings of this class may publish: `min`..`max` (default 1024..65535) minus
    /// `reserved`. A PortMap outside it is refused (Accepted False, PortOutsideClassRange or
    /// ReservedPort).
    #[serde(default)]
    pub ports: PortPolicy,
    /// Namespaces whose PortMaps may use this class, by their labels (matchLabels,
    /// matchExpressions); absent selects every namespace. A PortMap in another namespace is
    /// refused (Accepted False, NamespaceNotSelected).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// How a reply returns when the pod is not on the node that accepted the request: over a
    /// VXLAN link kuport builds between the two nodes (`mode: Vxlan`, default), or not at all
    /// (`mode: None`, such mappings are refused).
    #[serde(default)]
    pub return_path: ReturnPath,
    /// Endpoint addresses that are no Pod (a device behind a selector-less Service) that this
    /// class may deliver to, as IPv4 or IPv6 prefixes; any other endpoint must be a Pod of the
    /// PortMap's namespace (docs/portmap/modes.md, "Which endpoints are believed").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("each externalEndpoints entry must be a CIDR such as 192.168.50.0/24"))]
    // At most 16 prefixes: the API server's CEL cost budget for isCIDR over unbounded strings.
    #[schemars(length(max = 16))]
    pub external_endpoints: Vec<String>,
    /// What one namespace may hold in this class; beyond it the newest PortMaps are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<NamespaceLimits>,
    /// The client prefixes (IPv4 or IPv6) that may reach a mapping of this class that names none
    /// of its own; others are dropped on the accepting node before the DNAT. Empty lets every
    /// client in. Example: [192.0.2.0/24, 2001:db8:100::/48].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("each sourceRanges entry must be a CIDR such as 192.0.2.0/24"))]
    #[schemars(length(max = 64), inner(length(max = 43)))]
    pub source_ranges: Vec<String>,
    /// Mappings may only narrow spec.sourceRanges: each of a PortMap's own prefixes must lie
    /// inside one of the class's, or the PortMap is refused (SourceRangeOutsideClass).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pin_source_ranges: bool,
}

/// Per-namespace bounds of a class (docs/portmap/modes.md, "Bounds per namespace").
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceLimits {
    /// How many PortMaps of this class one namespace may hold, e.g. 10; absent: no bound. The
    /// newest beyond it are refused (Accepted False, NamespaceLimitExceeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_port_maps_per_namespace: Option<u32>,
    /// How many ports (a range counts each of its ports) one namespace may publish in this class,
    /// e.g. 200; absent: no bound. The newest PortMaps beyond it are refused (Accepted False,
    /// NamespaceLimitExceeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ports_per_namespace: Option<u32>,
}

/// A PortMap's per-source bounds (docs/portmap/guard.md, "Rate limits").
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimit {
    /// New connections (TCP SYNs, new UDP flows) one client address may open per second, e.g.
    /// 20; at least 1.
    #[schemars(range(min = 1))]
    pub new_per_second: u32,
    /// How many new connections a client may open at once before the rate holds it, e.g. 40;
    /// at least 1. Absent: the rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub burst: Option<u32>,
    /// The connections one client address may hold open at once, e.g. 8; at least 1. Absent: no
    /// bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_connections: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClassNode {
    /// Interface names on this node that accept the class's traffic, such as enp1s0 or wt0; the
    /// node's executor reports which it has.
    pub interfaces: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ServingMode {
    #[default]
    Single,
    Multi,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortPolicy {
    /// The lowest port a mapping may publish; default 1024, so a port below it (22, 25, 80) is
    /// published only where a class names it, e.g. `min: 25, max: 25` for a mail server.
    #[serde(default = "default_min_port")]
    pub min: u16,
    /// The highest port a mapping may publish; default 65535.
    #[serde(default = "default_max_port")]
    pub max: u16,
    /// Ports no mapping may publish, even inside min..max, e.g. [80, 443]. Ports the nodes keep
    /// for themselves (the API server's 6443, the kubelet's 10250, VXLAN and WireGuard ports)
    /// are refused whatever this says (Accepted False, ReservedPort).
    #[serde(default)]
    pub reserved: Vec<u16>,
}

/// Ports below this are published only when a class names them in `ports.min`
/// (docs/portmap/modes.md, "Ports no class publishes").
pub const DEFAULT_MIN_PORT: u16 = 1024;

fn default_min_port() -> u16 {
    DEFAULT_MIN_PORT
}
fn default_max_port() -> u16 {
    65535
}

impl Default for PortPolicy {
    fn default() -> Self {
        Self { min: default_min_port(), max: default_max_port(), reserved: Vec::new() }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReturnPath {
    /// `Vxlan` (default): each programming node without the pod gets a VXLAN link to the pod's
    /// node, and replies return over it. `None`: kuport builds no link, and a mapping that
    /// would need one is refused (Programmed False, ReturnPathUnavailable); fits classes whose
    /// pods run on the accepting nodes.
    #[serde(default)]
    pub mode: ReturnPathMode,
    /// The VXLAN links' numbering under `mode: Vxlan`: first VNI, UDP port and link subnets.
    /// The defaults (VNI 4200, port 4790, 169.254.77.0/24, fd64:f5ac:e961::/112) suit one
    /// class; another class may set its own to tell its links apart.
    #[serde(default)]
    pub vxlan: VxlanSpec,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ReturnPathMode {
    /// Build a VXLAN link from each programming node that lacks the pod to the pod's node.
    #[default]
    Vxlan,
    /// Build no link; refuse any mapping that would need one.
    None,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.subnet) || !has(self.subnet6) || !isCIDR(self.subnet) || !isCIDR(self.subnet6) || 128 - cidr(self.subnet6).prefixLength() >= 32 - cidr(self.subnet).prefixLength()").message("subnet6 must hold at least as many /127 links as subnet holds /31s (128 minus its prefix length at least 32 minus subnet's)"))]
#[serde(rename_all = "camelCase")]
pub struct VxlanSpec {
    /// The first VNI; a link's VNI is this plus its slot. Default 4200; 0 or above 16777215
    /// makes the class not Ready (InvalidVni).
    #[serde(default = "default_vni")]
    pub vni: u32,
    /// The links' UDP port, default 4790; must differ from the port of any VXLAN device of the CNI, as each
    /// node's executor reports them (8472 for Cilium and Flannel, 4789 for Calico).
    #[serde(default = "default_vxlan_port")]
    #[x_kube(validation = Rule::new("self != 0").message("port 0 is not a UDP port"))]
    pub port: u16,
    /// IPv4 subnet from which each node pair takes one /31, e.g. 169.254.77.0/24 (the
    /// default); prefix length 30 or shorter. A /24 holds 128 links.
    #[serde(default = "default_subnet")]
    #[x_kube(validation = Rule::new("isCIDR(self) && cidr(self).ip().family() == 4 && cidr(self).prefixLength() <= 30").message("subnet must be an IPv4 CIDR with room for at least one /31 link (prefix length 30 or shorter)"))]
    pub subnet: String,
    /// IPv6 subnet from which each node pair takes one /127, at the same slot as its /31;
    /// default fd64:f5ac:e961::/112. It must hold at least as many links as `subnet`.
    #[serde(default = "default_subnet6")]
    #[x_kube(validation = Rule::new("isCIDR(self) && cidr(self).ip().family() == 6").message("subnet6 must be an IPv6 CIDR"))]
    pub subnet6: String,
}

fn default_vni() -> u32 {
    DEFAULT_VNI_BASE
}
fn default_vxlan_port() -> u16 {
    DEFAULT_VXLAN_PORT
}
fn default_subnet() -> String {
    DEFAULT_LINK_SUBNET.to_string()
}
fn default_subnet6() -> String {
    DEFAULT_LINK_SUBNET6.to_string()
}

impl Default for VxlanSpec {
    fn default() -> Self {
        Self { vni: default_vni(), port: default_vxlan_port(), subnet: default_subnet(), subnet6: default_subnet6() }
    }
}

/// What the controller knows of a class: its link slots, its nodes, and whether it is Ready.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortMapClassStatus {
    /// Link slots claimed by node pairs. A slot never changes while its pair uses it.
    #[serde(default)]
    pub links: Vec<LinkSlot>,
    /// What the class knows of each node it involves, so a new leader computes the same MTUs.
    #[serde(default)]
    pub nodes: Vec<ClassNodeStatus>,
    /// `Ready`: True when the class's link settings are valid and its subnet has room; else
    /// False with InvalidSubnet, InvalidVni, VxlanPortConflict or SubnetExhausted.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkSlot {
    /// The two node names, sorted.
    pub pair: Vec<String>,
    /// The slot: the link's index in the class's subnets, and its VNI's offset from `vni`.
    pub slot: u32,
    /// The pair's /31: the first node of `pair` takes the lower address.
    pub subnet: String,
    /// The pair's /127, the same way; a row without it takes the /127 of its slot in the
    /// class's subnet6.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subnet6: String,
    /// Set once no mapping uses the link; the slot is released 24 h later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unused_since: Option<Time>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClassNodeStatus {
    /// The Node's name.
    pub name: String,
    /// Whether the Node is Ready.
    pub ready: bool,
    /// Why the node cannot take part (no Node object, Node not Ready, a refused executor report,
    /// a CNI VXLAN device on the class's port); empty when all is well.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The node's address the VXLAN links to it are sent to, as its executor reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub underlay_address: Option<String>,
    /// The MTU of the node's underlay, as its executor reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub underlay_mtu: Option<u32>,
    /// The MTU of the node's VXLAN links: the underlay MTU less 50 bytes of VXLAN overhead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_mtu: Option<u32>,
    /// Addresses of the node's accepting interfaces.
    #[serde(default)]
    pub addresses: Vec<InterfaceAddress>,
    /// Which of the class's interfaces the node's executor reported having, once it reported:
    /// a new leader decides NoInterfaceOnNode from this until the executor reconnects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interfaces: Option<Vec<String>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceAddress {
    /// The accepting interface, such as enp1s0.
    pub interface: String,
    /// One of its addresses, such as 203.0.113.10.
    pub address: String,
}

/// Publishes a port or port range and delivers it to one pod behind a Service.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "kuport.wlz.li",
    version = "v1alpha1",
    derive = "PartialEq",
    kind = "PortMap",
    namespaced,
    shortname = "pm",
    status = "PortMapStatus",
    printcolumn = r#"{"name":"Class","type":"string","jsonPath":".spec.className"}"#,
    printcolumn = r#"{"name":"Protocol","type":"string","jsonPath":".spec.protocol"}"#,
    printcolumn = r#"{"name":"Port","type":"integer","jsonPath":".spec.port"}"#,
    printcolumn = r#"{"name":"End","type":"integer","jsonPath":".spec.endPort"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.endpoint.node"}"#,
    printcolumn = r#"{"name":"Programmed","type":"string","jsonPath":".status.conditions[?(@.type==\"Programmed\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Published","type":"string","priority":1,"jsonPath":".status.published[*].address"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Programmed\")].reason"}"#
)]
#[x_kube(validation = Rule::new("!has(self.endPort) || self.endPort >= self.port").message("endPort must not be below port"))]
#[x_kube(validation = Rule::new("has(self.endPort) == has(oldSelf.endPort) && (!has(self.endPort) || self.endPort == oldSelf.endPort)").message("endPort is immutable: delete and recreate the PortMap"))]
#[serde(rename_all = "camelCase")]
pub struct PortMapSpec {
    /// The PortMapClass whose nodes publish this mapping, e.g. `public`. Immutable. A name of no
    /// class, or a class whose namespaceSelector leaves this namespace out, is refused (Accepted
    /// False, ClassNotFound or NamespaceNotSelected).
    #[x_kube(validation = Rule::new("self == oldSelf").message("className is immutable: delete and recreate the PortMap"))]
    pub class_name: String,
    /// `TCP` or `UDP`: the protocol published, which must be the Service port's. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("protocol is immutable: delete and recreate the PortMap"))]
    pub protocol: Protocol,
    /// The published port, or the first of a range, e.g. 2222. Immutable. It must lie in the
    /// class's `ports` and not be reserved, nor overlap an older mapping of the protocol on the
    /// same nodes (Accepted False, PortOutsideClassRange, ReservedPort or PortConflict).
    #[x_kube(validation = Rule::new("self == oldSelf").message("port is immutable: delete and recreate the PortMap"))]
    pub port: u16,
    /// The last port of an inclusive range, e.g. port 30000 with endPort 30099; absent for one
    /// port. A range goes to the same port numbers on the pod. Not below `port`; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_port: Option<u16>,
    /// Narrows the class's interfaces to these names, e.g. [wt0]; absent: all of the class's. A
    /// name no node of the class has is refused (Accepted False, InterfaceNotInClass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interfaces: Option<Vec<String>>,
    /// The Service, in this PortMap's namespace, whose ready endpoint receives the traffic: one
    /// pod Kubernetes vouches for, chosen the same way by every controller replica.
    pub service_ref: ServiceRef,
    /// The client prefixes (IPv4 or IPv6) that may reach this mapping; others are dropped on
    /// every accepting node before the DNAT, and counted. Empty takes the class's
    /// spec.sourceRanges; both empty let every client in. A family with no prefix here is
    /// closed to every client of that family. Example: [192.0.2.0/24].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("each sourceRanges entry must be a CIDR such as 192.0.2.0/24"))]
    #[schemars(length(max = 64), inner(length(max = 43)))]
    pub source_ranges: Vec<String>,
    /// Per-source bounds on the accepting nodes, before the DNAT: new connections (TCP SYNs, new
    /// UDP flows) per client address per second, and optionally the connections one client may
    /// hold at once. Beyond them a client's new connections are dropped and counted; other
    /// clients are unaffected. Absent: no bound. docs/portmap/guard.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
pub enum Protocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRef {
    /// The Service's name, e.g. `ssh`. A missing Service leaves the mapping unprogrammed
    /// (Programmed False, NoReadyEndpoint).
    pub name: String,
    /// The Service port's name, e.g. `ssh`; may be omitted when the Service has one port. A single
    /// port goes to that Service port's target port on the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
}

/// Where the mapping is delivered and published, and whether it is accepted and programmed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortMapStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The one pod that receives the traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<EndpointStatus>,
    /// Where clients can dial the mapping.
    #[serde(default)]
    pub published: Vec<PublishedAddress>,
    /// `Accepted` (the spec passes the class's checks; else the reason, e.g. PortConflict) and
    /// `Programmed` (every node that must apply it has; else the reason, e.g. NoReadyEndpoint or
    /// Pending). docs/portmap/modes.md lists every reason.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStatus {
    /// The pod's node.
    pub node: String,
    /// The pod's IPv4 address, from the Service's EndpointSlice.
    pub address: String,
    /// The same pod's IPv6 address, from the Service's IPv6 EndpointSlice; empty when the
    /// mapping is IPv4 only.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address6: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PublishedAddress {
    /// A programming node.
    pub node: String,
    /// One of its accepting interfaces.
    pub interface: String,
    /// An address of that interface clients can dial, as the node's executor reported it; empty
    /// until it reports.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
}
