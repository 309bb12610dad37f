//! The lab's topology: which nodes, pods, Services and internet clients exist, and which hosts
//! reach which. Read from YAML; every error names the file, the field and the reason.
//!
//! Reachability: nodes whose underlays name the same `network` share one L2 segment (a bridge
//! in the lab's switch namespace) and reach each other by their underlay addresses; nodes on
//! different networks cannot. A client reaches exactly the node interfaces it `attach`es to:
//! the first carries its default route, each further one only the route to that interface's
//! address, and every node it attaches to routes the client's address back out that interface
//! (a worker's "own internet connection").
//!
//! Sites (docs/overlay/lab.md): a node with `nat` sits alone on a private LAN behind its own
//! router namespace (`<node>-nat`), whose WAN address `nat.public` is on the node's `network`;
//! the router masquerades the LAN (`masquerade`, a home) or maps the public address one to one
//! onto the node's (`oneToOne`, a VM with a private address). A client with a `network` sits on
//! that network's segment (an "internet" client). With `overlay: true` the lab runs kuport's
//! WireGuard mesh, and `cni: bridge` makes each node's pod network a bridge `cni0` (`cni:
//! calico`: Calico's per-pod veths with /32 routes; the default is the Cilium emulation).
//!
//! IPv6 (dual-stack): a node with `podCidr6` gives every pod on it an IPv6 address as well (see
//! [`NodeSpec::pod_address6`]); public interfaces, the underlay interface and clients take an
//! optional `address6`. The underlay itself (VXLAN's outer header, WireGuard) stays IPv4: an
//! underlay's `address6` is only an address clients may reach the node at.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::str::FromStr;

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

/// The topology `kuport-lab up` uses when given none.
pub const DEFAULT_YAML: &str = include_str!("../topologies/default.yaml");
/// Three accepting workers with a client entering at each: the Multi scenarios.
pub const MULTI_YAML: &str = include_str!("../topologies/multi.yaml");
/// Three sites joined only by an internet, meshed by kuport's overlay (docs/overlay/lab.md).
pub const SITES_YAML: &str = include_str!("../topologies/sites.yaml");
pub const HOMES_YAML: &str = include_str!("../topologies/homes.yaml");

/// Pods may not serve more ports than this (each is one socket in the echo server).
pub const MAX_PORTS_PER_POD: u32 = 2048;

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("{file}: cannot read: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("{file}: field {field}: {reason}")]
    Field { file: String, field: String, reason: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Topology {
    /// Run kuport's WireGuard mesh between the nodes (the controller's `--overlay`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overlay: bool,
    /// The CNI the lab emulates on every node.
    #[serde(default, skip_serializing_if = "Cni::is_default")]
    pub cni: Cni,
    /// Namespaces with labels (for classes' namespace selectors). Namespaces that pods and
    /// Services name exist without being listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<NamespaceSpec>,
    pub nodes: Vec<NodeSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<PodSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<ClientSpec>,
}

/// The CNI the lab emulates (see [`crate::cni`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Cni {
    /// Cilium's devices: `cilium_host`, `lxc*`, a tc redirect per pod.
    #[default]
    Cilium,
    /// The bridge plugin with host-local IPAM (Flannel's and k3s' pod network): a bridge `cni0`
    /// with the pod CIDR's first address, the pods' veths on it.
    Bridge,
    /// Calico's devices: per pod a veth `cali<11 hex>` with the pod's /32 route on it, proxy
    /// ARP for the pods' gateway `169.254.1.1`, no host device.
    Calico,
}

impl Cni {
    /// Every emulation, for tests that run on each.
    pub const ALL: [Cni; 3] = [Cni::Cilium, Cni::Bridge, Cni::Calico];

    fn is_default(&self) -> bool {
        *self == Cni::Cilium
    }
}

impl fmt::Display for Cni {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cni::Cilium => "cilium",
            Cni::Bridge => "bridge",
            Cni::Calico => "calico",
        })
    }
}

/// A node's own NAT router (a site of docs/overlay/lab.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Nat {
    pub kind: NatKind,
    /// The router's WAN address on the node's network, with the segment's prefix length.
    pub public: Cidr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NatKind {
    /// A home: everything from the LAN leaves masqueraded to the public address; nothing
    /// enters unasked, so the node sends first.
    Masquerade,
    /// A home behind a router that gives every flow a random port of its own (`masquerade
    /// random`: endpoint-dependent mapping, as carrier-grade NAT does). Where one peer sees the
    /// node's packets come from tells no other peer anything, so no hole can be punched: two
    /// such homes reach each other only through a relay (docs/overlay/relays.md).
    Symmetric,
    /// A VM with a private address: the public address is the node's, both ways. The Node
    /// gets the annotation `kuport.wlz.li/external-endpoint` with it.
    OneToOne,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The Node's Ready condition.
    #[serde(default = "yes")]
    pub ready: bool,
    /// The node's pod CIDR; its first address is the CNI's router address on `cilium_host`.
    pub pod_cidr: Cidr,
    /// The node's IPv6 pod prefix (a /64, say): every pod on the node gets an IPv6 address in
    /// it ([`NodeSpec::pod_address6`]); its first address is the CNI's IPv6 router address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_cidr6: Option<Cidr6>,
    pub underlay: Underlay,
    /// Public interfaces: clients attach to them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub public: Vec<PublicInterface>,
    /// Behind its own NAT router; absent: the underlay address is on the network itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat: Option<Nat>,
}

impl NodeSpec {
    /// The node's router's host name (`<node>-nat`), when it has one.
    pub fn router_host(&self) -> Option<String> {
        self.nat.as_ref().map(|_| format!("{}-nat", self.name))
    }

    /// The router's LAN address: the first host of the node's segment.
    pub fn lan_gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.underlay.address.0.network()) + 1)
    }

    /// A pod's IPv6 address on this node: the IPv6 pod prefix plus the pod's offset in the
    /// IPv4 pod CIDR (`10.244.2.107` in `10.244.2.0/24` is `fd10:244:2::6b` in
    /// `fd10:244:2::/64`), so a pod keeps both addresses in step, also when it moves. None when
    /// the node has no IPv6 pod prefix (or the pod's address is outside the IPv4 one).
    pub fn pod_address6(&self, pod: &PodSpec) -> Option<Ipv6Addr> {
        let net6 = self.pod_cidr6?.0.trunc();
        let net4 = self.pod_cidr.0.trunc();
        let offset = u32::from(pod.address).checked_sub(u32::from(net4.network()))?;
        net4.contains(&pod.address).then(|| Ipv6Addr::from(u128::from(net6.network()) + u128::from(offset)))
    }

    /// Where its peers reach it: the public address of a 1:1 NAT, else the underlay address.
    pub fn reachable_address(&self) -> Option<Ipv4Addr> {
        match &self.nat {
            None => Some(self.underlay.address.addr()),
            Some(n) if n.kind == NatKind::OneToOne => Some(n.public.addr()),
            Some(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Underlay {
    /// The node's underlay interface (the mesh's device on a real cluster).
    #[serde(default = "default_underlay_interface")]
    pub interface: String,
    /// Nodes on the same network reach each other.
    #[serde(default = "default_network")]
    pub network: String,
    /// The node's underlay address with the segment's prefix length: the Node's InternalIP.
    pub address: Cidr,
    /// An IPv6 address on the underlay interface (a second InternalIP): clients on the network
    /// reach the node there; kuport's links still ride IPv4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address6: Option<Cidr6>,
    #[serde(default = "default_mtu")]
    pub mtu: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PublicInterface {
    pub interface: String,
    /// The interface's address with its prefix length.
    pub address: Cidr,
    /// Its IPv6 address with its prefix length; clients with an `address6` reach it over IPv6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address6: Option<Cidr6>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub node: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Inside the node's pod CIDR.
    pub address: Ipv4Addr,
    /// The endpoint's ready condition.
    #[serde(default = "yes")]
    pub ready: bool,
    /// TCP ports the pod's echo server listens on (a port or "first-last").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tcp: Vec<Ports>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub udp: Vec<Ports>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceSpec {
    pub name: String,
    pub namespace: String,
    /// Pods of the namespace whose labels include all of these are its endpoints.
    pub selector: BTreeMap<String, String>,
    pub ports: Vec<ServicePortSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServicePortSpec {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    /// The pod's port; the Service port when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Protocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientSpec {
    pub name: String,
    /// The client's one address (a /32), outside every pod CIDR.
    pub address: Ipv4Addr,
    /// Its IPv6 address (a /128), used over the attachments whose interface has an IPv6
    /// address (the first of them carries the IPv6 default route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address6: Option<Ipv6Addr>,
    /// `node/interface` of public interfaces; the first carries the default route.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attach: Vec<String>,
    /// An underlay network the client sits on (inside its segment), instead of attachments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

/// An IPv4 address with a prefix length, as `100.64.0.11/16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cidr(pub Ipv4Net);

impl Cidr {
    pub fn addr(&self) -> Ipv4Addr {
        self.0.addr()
    }
}

impl TryFrom<String> for Cidr {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Ipv4Net::from_str(&s).map(Cidr).map_err(|_| format!("{s:?} is not an IPv4 address with a prefix length"))
    }
}

impl From<Cidr> for String {
    fn from(c: Cidr) -> String {
        c.0.to_string()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An IPv6 address with a prefix length, as `2001:db8::9/64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cidr6(pub Ipv6Net);

impl Cidr6 {
    pub fn addr(&self) -> Ipv6Addr {
        self.0.addr()
    }
}

impl TryFrom<String> for Cidr6 {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Ipv6Net::from_str(&s).map(Cidr6).map_err(|_| format!("{s:?} is not an IPv6 address with a prefix length"))
    }
}

impl From<Cidr6> for String {
    fn from(c: Cidr6) -> String {
        c.0.to_string()
    }
}

impl fmt::Display for Cidr6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A port or an inclusive range `first-last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PortsRaw", into = "PortsRaw")]
pub struct Ports {
    pub first: u16,
    pub last: u16,
}

impl Ports {
    pub fn iter(&self) -> impl Iterator<Item = u16> {
        self.first..=self.last
    }
    pub fn len(&self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last { write!(f, "{}", self.first) } else { write!(f, "{}-{}", self.first, self.last) }
    }
}

impl FromStr for Ports {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a port (1-65535) or a range first-last");
        let port = |p: &str| p.trim().parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(bad);
        let (first, last) = match s.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => (port(s)?, port(s)?),
        };
        if first > last {
            return Err(format!("{s:?}: the range ends before it starts"));
        }
        Ok(Ports { first, last })
    }
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum PortsRaw {
    One(u32),
    Text(String),
}

impl TryFrom<PortsRaw> for Ports {
    type Error = String;
    fn try_from(raw: PortsRaw) -> Result<Self, String> {
        match raw {
            PortsRaw::One(n) => Ports::from_str(&n.to_string()),
            PortsRaw::Text(s) => Ports::from_str(&s),
        }
    }
}

impl From<Ports> for PortsRaw {
    fn from(p: Ports) -> PortsRaw {
        if p.first == p.last { PortsRaw::One(p.first.into()) } else { PortsRaw::Text(p.to_string()) }
    }
}

fn yes() -> bool {
    true
}
fn default_underlay_interface() -> String {
    "wt0".into()
}
fn default_network() -> String {
    "underlay".into()
}
fn default_mtu() -> u32 {
    1500
}

impl Topology {
    /// The shipped default topology.
    pub fn default_lab() -> Topology {
        Topology::parse("topologies/default.yaml", DEFAULT_YAML).expect("the shipped default topology is valid")
    }

    /// The shipped Multi topology.
    pub fn multi_lab() -> Topology {
        Topology::parse("topologies/multi.yaml", MULTI_YAML).expect("the shipped Multi topology is valid")
    }

    /// The shipped sites topology (docs/overlay/lab.md).
    pub fn sites_lab() -> Topology {
        Topology::parse("topologies/sites.yaml", SITES_YAML).expect("the shipped sites topology is valid")
    }

    /// The shipped homes topology: two homes that reach each other only through a relay
    /// (docs/overlay/relays.md, "The lab").
    pub fn homes_lab() -> Topology {
        Topology::parse("topologies/homes.yaml", HOMES_YAML).expect("the shipped homes topology is valid")
    }

    /// The same topology with another CNI emulated on every node: the default and Multi
    /// scenarios run on each (docs/overlay/lab.md, "The CNI emulations").
    pub fn with_cni(mut self, cni: Cni) -> Topology {
        self.cni = cni;
        self
    }

    /// A shipped topology by name (`default`, `multi`, `sites`, `homes`).
    pub fn shipped(name: &str) -> Option<Topology> {
        match name {
            "default" => Some(Topology::default_lab()),
            "multi" => Some(Topology::multi_lab()),
            "sites" => Some(Topology::sites_lab()),
            "homes" => Some(Topology::homes_lab()),
            _ => None,
        }
    }

    pub fn load(path: &Path) -> Result<Topology, TopologyError> {
        let file = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| TopologyError::Read { file: file.clone(), source })?;
        Topology::parse(&file, &text)
    }

    /// Parses and validates; `file` names the source in errors.
    pub fn parse(file: &str, text: &str) -> Result<Topology, TopologyError> {
        let de = serde_yaml::Deserializer::from_str(text);
        let topology: Topology = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let reason = e.into_inner().to_string();
            // serde_yaml starts its message with the path of the enclosing mapping; the field
            // already says where.
            let reason = match reason.split_once(": ") {
                Some((p, r)) if field.starts_with(p) => r.to_string(),
                _ => reason,
            };
            TopologyError::Field {
                file: file.to_string(),
                field: if field == "." { "(document)".into() } else { field },
                reason,
            }
        })?;
        topology.validate().map_err(|(field, reason)| TopologyError::Field {
            file: file.to_string(),
            field,
            reason,
        })?;
        Ok(topology)
    }

    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("a topology serializes")
    }

    pub fn node(&self, name: &str) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.name == name)
    }

    pub fn pod(&self, name: &str) -> Option<&PodSpec> {
        self.pods.iter().find(|p| p.name == name)
    }

    pub fn client(&self, name: &str) -> Option<&ClientSpec> {
        self.clients.iter().find(|c| c.name == name)
    }

    /// A pod's IPv6 address, when its node has an IPv6 pod prefix ([`NodeSpec::pod_address6`]).
    pub fn pod_address6(&self, pod: &PodSpec) -> Option<Ipv6Addr> {
        self.node(&pod.node)?.pod_address6(pod)
    }

    /// The IPv6 address of public interface `iface` of `node`, when it has one.
    pub fn public_address6(&self, node: &str, iface: &str) -> Option<Ipv6Addr> {
        let n = self.node(node)?;
        n.public.iter().find(|p| p.interface == iface)?.address6.map(|a| a.addr())
    }

    /// Every host (node, pod, client, NAT router) by name: each is one network namespace.
    pub fn hosts(&self) -> Vec<(String, HostKind)> {
        let nodes = self.nodes.iter().map(|n| (n.name.clone(), HostKind::Node));
        let pods = self.pods.iter().map(|p| (p.name.clone(), HostKind::Pod));
        let clients = self.clients.iter().map(|c| (c.name.clone(), HostKind::Client));
        let routers = self.nodes.iter().filter_map(|n| n.router_host().map(|r| (r, HostKind::Router)));
        nodes.chain(pods).chain(clients).chain(routers).collect()
    }

    /// The underlay networks, in order of first mention.
    pub fn networks(&self) -> Vec<&str> {
        let mut seen = Vec::new();
        for n in &self.nodes {
            if !seen.contains(&n.underlay.network.as_str()) {
                seen.push(n.underlay.network.as_str());
            }
        }
        seen
    }

    /// The clients attached to `node`'s public interface `iface`.
    pub fn clients_on(&self, node: &str, iface: &str) -> Vec<&ClientSpec> {
        let key = format!("{node}/{iface}");
        self.clients.iter().filter(|c| c.attach.contains(&key)).collect()
    }

    /// Checks what YAML alone cannot; the error is (field path, reason).
    pub fn validate(&self) -> Result<(), (String, String)> {
        let mut hosts = BTreeSet::new();
        let err = |field: String, reason: String| Err((field, reason));
        if self.nodes.is_empty() {
            return err("nodes".into(), "at least one node is needed".into());
        }
        for (i, n) in self.namespaces.iter().enumerate() {
            check_name(&n.name).or_else(|r| err(format!("namespaces[{i}].name"), r))?;
        }
        let mut cidrs: Vec<(&str, Ipv4Net)> = Vec::new();
        let mut cidrs6: Vec<(&str, Ipv6Net)> = Vec::new();
        let mut underlays = BTreeSet::new();
        let mut underlays6 = BTreeSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let f = |s: &str| format!("nodes[{i}].{s}");
            check_name(&n.name).or_else(|r| err(f("name"), r))?;
            if !hosts.insert(n.name.as_str()) {
                return err(f("name"), format!("{:?} names a second host", n.name));
            }
            let cidr = n.pod_cidr.0.trunc();
            if n.pod_cidr.0.prefix_len() > 29 {
                return err(f("podCidr"), format!("{} is too small: at most /29", n.pod_cidr));
            }
            if let Some((other, _)) = cidrs.iter().find(|(_, c)| c.contains(&cidr) || cidr.contains(c)) {
                return err(f("podCidr"), format!("{cidr} overlaps node {other}'s pod CIDR"));
            }
            cidrs.push((&n.name, cidr));
            if let Some(c6) = n.pod_cidr6 {
                let c6 = c6.0.trunc();
                // Every pod's offset in the IPv4 pod CIDR must fit (see pod_address6).
                if 128 - u32::from(c6.prefix_len()) < 32 - u32::from(cidr.prefix_len()) {
                    return err(f("podCidr6"), format!("{c6} is smaller than the pod CIDR {cidr}"));
                }
                if let Some((other, _)) = cidrs6.iter().find(|(_, c)| c.contains(&c6) || c6.contains(c)) {
                    return err(f("podCidr6"), format!("{c6} overlaps node {other}'s IPv6 pod prefix"));
                }
                cidrs6.push((&n.name, c6));
            }
            let u = &n.underlay;
            check_iface(&u.interface).or_else(|r| err(f("underlay.interface"), r))?;
            check_name(&u.network).or_else(|r| err(f("underlay.network"), r))?;
            if !(576..=9000).contains(&u.mtu) {
                return err(f("underlay.mtu"), format!("{} is outside 576-9000", u.mtu));
            }
            if u.address.0.prefix_len() >= 31 || u.address.addr() == u.address.0.network() {
                return err(f("underlay.address"), format!("{} is not a host address on a segment", u.address));
            }
            if !underlays.insert(u.address.addr()) {
                return err(f("underlay.address"), format!("{} is another node's too", u.address.addr()));
            }
            if let Some(a6) = u.address6 {
                if a6.0.prefix_len() >= 127 || a6.addr() == a6.0.network() {
                    return err(f("underlay.address6"), format!("{a6} is not a host address on a segment"));
                }
                if n.nat.is_some() {
                    return err(f("underlay.address6"), "a node behind NAT has no IPv6 underlay address".into());
                }
                if !underlays6.insert(a6.addr()) {
                    return err(f("underlay.address6"), format!("{} is another node's too", a6.addr()));
                }
            }
            if let Some(nat) = &n.nat {
                let lan = u.address.0.trunc();
                if n.lan_gateway() == u.address.addr() || lan.prefix_len() > 30 {
                    return err(
                        f("underlay.address"),
                        format!("{}: the router takes the segment's first host", u.address),
                    );
                }
                if nat.public.0.prefix_len() >= 31 || nat.public.addr() == nat.public.0.network() {
                    return err(f("nat.public"), format!("{} is not a host address on a segment", nat.public));
                }
                if !underlays.insert(nat.public.addr()) {
                    return err(f("nat.public"), format!("{} is another host's too", nat.public.addr()));
                }
            }
            let mut ifaces = BTreeSet::from([u.interface.as_str()]);
            for (j, p) in n.public.iter().enumerate() {
                check_iface(&p.interface).or_else(|r| err(f(&format!("public[{j}].interface")), r))?;
                if !ifaces.insert(p.interface.as_str()) {
                    return err(f(&format!("public[{j}].interface")), format!("{:?} is named twice", p.interface));
                }
                if p.address.0.prefix_len() >= 31 {
                    return err(
                        f(&format!("public[{j}].address")),
                        format!("{}: use a prefix of /30 or wider", p.address),
                    );
                }
                if let Some(a6) = p.address6
                    && a6.0.prefix_len() >= 127
                {
                    return err(f(&format!("public[{j}].address6")), format!("{a6}: use a prefix of /126 or wider"));
                }
            }
        }
        for (i, p) in self.pods.iter().enumerate() {
            let f = |s: &str| format!("pods[{i}].{s}");
            check_name(&p.name).or_else(|r| err(f("name"), r))?;
            check_name(&p.namespace).or_else(|r| err(f("namespace"), r))?;
            if !hosts.insert(p.name.as_str()) {
                return err(f("name"), format!("{:?} names a second host (pod names are unique in a lab)", p.name));
            }
            let Some(node) = self.node(&p.node) else {
                return err(f("node"), format!("no node is named {:?}", p.node));
            };
            let cidr = node.pod_cidr.0.trunc();
            if !cidr.contains(&p.address) {
                return err(f("address"), format!("{} is outside node {}'s pod CIDR {cidr}", p.address, node.name));
            }
            if [cidr.network(), cidr.broadcast(), router(node)].contains(&p.address) {
                return err(
                    f("address"),
                    format!("{} is the network, broadcast or router address of {cidr}", p.address),
                );
            }
            if let Some(q) = self.pods[..i].iter().find(|q| q.address == p.address) {
                return err(f("address"), format!("{} is pod {}'s address too", p.address, q.name));
            }
            let count: u32 = p.tcp.iter().chain(&p.udp).map(Ports::len).sum();
            if count > MAX_PORTS_PER_POD {
                return err(f("tcp"), format!("{count} ports in all; at most {MAX_PORTS_PER_POD}"));
            }
        }
        for (i, s) in self.services.iter().enumerate() {
            let f = |s: &str| format!("services[{i}].{s}");
            check_name(&s.name).or_else(|r| err(f("name"), r))?;
            check_name(&s.namespace).or_else(|r| err(f("namespace"), r))?;
            if self.services[..i].iter().any(|o| o.name == s.name && o.namespace == s.namespace) {
                return err(f("name"), format!("Service {}/{} is defined twice", s.namespace, s.name));
            }
            if s.ports.is_empty() {
                return err(f("ports"), "a Service needs at least one port".into());
            }
            for (j, p) in s.ports.iter().enumerate() {
                if p.port == 0 || p.target_port == Some(0) {
                    return err(f(&format!("ports[{j}]")), "ports are 1-65535".into());
                }
            }
        }
        for (i, c) in self.clients.iter().enumerate() {
            let f = |s: &str| format!("clients[{i}].{s}");
            check_name(&c.name).or_else(|r| err(f("name"), r))?;
            if !hosts.insert(c.name.as_str()) {
                return err(f("name"), format!("{:?} names a second host", c.name));
            }
            if let Some((node, _)) = cidrs.iter().find(|(_, n)| n.contains(&c.address)) {
                return err(f("address"), format!("{} is inside node {node}'s pod CIDR", c.address));
            }
            if let Some(a6) = c.address6 {
                if let Some((node, _)) = cidrs6.iter().find(|(_, n)| n.contains(&a6)) {
                    return err(f("address6"), format!("{a6} is inside node {node}'s IPv6 pod prefix"));
                }
                match &c.network {
                    Some(net) => {
                        if !self.segments6(net).iter().any(|s| s.contains(&a6)) {
                            return err(f("address6"), format!("{a6} is outside network {net}'s IPv6 segments"));
                        }
                        if !underlays6.insert(a6) {
                            return err(f("address6"), format!("{a6} is another host's too"));
                        }
                    }
                    None => {
                        let over_v6 = c
                            .attach
                            .iter()
                            .any(|a| a.split_once('/').and_then(|(n, i)| self.public_address6(n, i)).is_some());
                        if !over_v6 {
                            return err(f("address6"), "none of the client's attachments has an IPv6 address".into());
                        }
                    }
                }
            }
            if let Some(net) = &c.network {
                if !self.networks().contains(&net.as_str()) {
                    return err(f("network"), format!("no node is on network {net:?}"));
                }
                if !c.attach.is_empty() {
                    return err(f("attach"), "a client on a network attaches to nothing else".into());
                }
                if !underlays.insert(c.address) {
                    return err(f("address"), format!("{} is another host's too", c.address));
                }
                if !self.segments(net).iter().any(|s| s.contains(&c.address)) {
                    return err(f("address"), format!("{} is outside network {net}'s segments", c.address));
                }
                continue;
            }
            if c.attach.is_empty() {
                return err(f("attach"), "a client attaches to at least one node interface".into());
            }
            for (j, a) in c.attach.iter().enumerate() {
                let found = a
                    .split_once('/')
                    .and_then(|(n, i)| self.node(n).map(|n| n.public.iter().any(|p| p.interface == i)));
                if found != Some(true) {
                    return err(
                        f(&format!("attach[{j}]")),
                        format!("{a:?} is not node/interface of a public interface"),
                    );
                }
                if c.attach[..j].contains(a) {
                    return err(f(&format!("attach[{j}]")), format!("{a:?} is listed twice"));
                }
            }
            if c.attach.len() > 8 {
                return err(f("attach"), "at most 8 attachments".into());
            }
        }
        let all = self.hosts();
        for (i, (h, _)) in all.iter().enumerate() {
            if all[..i].iter().any(|(o, _)| o == h) {
                return err("nodes".into(), format!("{h:?} names two hosts (a NAT router is <node>-nat)"));
            }
        }
        Ok(())
    }

    /// The IPv6 prefixes on network `net`: its nodes' underlay `address6` segments.
    pub fn segments6(&self, net: &str) -> Vec<Ipv6Net> {
        let on = self.nodes.iter().filter(|n| n.underlay.network == net);
        on.filter_map(|n| n.underlay.address6.map(|a| a.0.trunc())).collect()
    }

    /// The prefixes on network `net`: its nodes' underlays and its NAT routers' WAN addresses.
    pub fn segments(&self, net: &str) -> Vec<Ipv4Net> {
        let on = self.nodes.iter().filter(|n| n.underlay.network == net);
        on.map(|n| n.nat.as_ref().map_or(n.underlay.address.0.trunc(), |nat| nat.public.0.trunc())).collect()
    }
}

/// Which kind of host a namespace is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    Node,
    Pod,
    Client,
    /// A node's NAT router.
    Router,
}

/// The CNI's router address on a node: the first address of its pod CIDR, on `cilium_host`.
pub fn router(node: &NodeSpec) -> Ipv4Addr {
    let net = u32::from(node.pod_cidr.0.network());
    Ipv4Addr::from(net + 1)
}

/// The CNI's IPv6 router address on a node, when it has an IPv6 pod prefix: its first address.
pub fn router6(node: &NodeSpec) -> Option<Ipv6Addr> {
    node.pod_cidr6.map(|c| Ipv6Addr::from(u128::from(c.0.network()) + 1))
}

/// Kubernetes-style names: lowercase letters, digits and '-', starting and ending alphanumeric.
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok { Ok(()) } else { Err(format!("{name:?} is not a name: 1-40 of a-z, 0-9 and '-', not at either end")) }
}

/// Interface names the lab can create and that do not clash with the CNI's or kuport's own.
fn check_iface(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 15 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        return Err(format!("{name:?} is not an interface name (1-15 of a-z, 0-9, '-', '_', '.')"));
    }
    if name == "lo"
        || ["cilium_", "lxc", "cali", "cni0", "vxlan.calico", "kup-", "lab-"].iter().any(|p| name.starts_with(p))
    {
        return Err(format!("{name:?} is reserved by the lab, the CNI or kuport"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_topologies_parse() {
        let t = Topology::default_lab();
        assert!(t.node("edge-a").is_some() && t.node("worker-1").is_some() && t.node("worker-2").is_some());
        assert!(!t.clients.is_empty());
        let m = Topology::multi_lab();
        assert_eq!(m.nodes.len(), 3);
        let s = Topology::sites_lab();
        assert!(s.overlay && s.cni == Cni::Bridge);
        assert_eq!(s.hosts().iter().filter(|(_, k)| *k == HostKind::Router).count(), 2);
        // Round trip.
        assert_eq!(Topology::parse("x", &t.to_yaml()).unwrap(), t);
        assert_eq!(Topology::parse("x", &m.to_yaml()).unwrap(), m);
        assert_eq!(Topology::parse("x", &s.to_yaml()).unwrap(), s);
        for cni in Cni::ALL {
            let c = Topology::default_lab().with_cni(cni);
            assert_eq!(Topology::parse("x", &c.to_yaml()).unwrap(), c, "{cni}");
        }
    }

    fn error(text: &str) -> String {
        Topology::parse("t.yaml", text).unwrap_err().to_string()
    }

    const NODE: &str = "nodes:\n- name: a\n  podCidr: 10.244.1.0/24\n  underlay: {address: 100.64.0.1/16}\n";

    #[test]
    fn errors_name_file_field_and_reason() {
        assert_eq!(
            error("nodes:\n- name: a\n  podCidr: 10.244.1.0/33\n  underlay: {address: 100.64.0.1/16}\n"),
            "t.yaml: field nodes[0].podCidr: \"10.244.1.0/33\" is not an IPv4 address with a prefix length at line 2 column 3"
        );
        let e = error(&format!("{NODE}  colour: red\n"));
        assert!(e.starts_with("t.yaml: field nodes[0].colour: unknown field `colour`"), "{e}");
        let e = error(&format!("{NODE}pods:\n- {{name: p, namespace: n, node: a, address: 10.244.2.5, tcp: [80]}}\n"));
        assert_eq!(e, "t.yaml: field pods[0].address: 10.244.2.5 is outside node a's pod CIDR 10.244.1.0/24");
        let e =
            error(&format!("{NODE}pods:\n- {{name: p, namespace: n, node: a, address: 10.244.1.5, udp: [\"9-3\"]}}\n"));
        assert!(e.starts_with("t.yaml: field pods[0].udp[0]: \"9-3\": the range ends before it starts"), "{e}");
        let e = error(&format!("{NODE}clients:\n- {{name: c, address: 1.2.3.4, attach: [a/enp1s0]}}\n"));
        assert_eq!(e, "t.yaml: field clients[0].attach[0]: \"a/enp1s0\" is not node/interface of a public interface");
        let e = error(&format!("{NODE}pods:\n- {{name: a, namespace: n, node: a, address: 10.244.1.5}}\n"));
        assert!(e.contains("field pods[0].name: \"a\" names a second host"), "{e}");
        let e = error("nodes: []\n");
        assert_eq!(e, "t.yaml: field nodes: at least one node is needed");
        let e = error(&format!("{NODE}  public: [{{interface: lxc0, address: 1.2.3.4/24}}]\n"));
        assert!(e.contains("field nodes[0].public[0].interface: \"lxc0\" is reserved"), "{e}");
    }

    #[test]
    fn sites_errors() {
        let nat = "nodes:\n- name: a\n  podCidr: 10.244.1.0/24\n  underlay: {address: 192.168.1.1/24}\n  nat: {kind: masquerade, public: 203.0.113.2/24}\n";
        assert!(
            error(nat).contains("field nodes[0].underlay.address: 192.168.1.1/24: the router takes"),
            "{}",
            error(nat)
        );
        let e = error(&format!("{NODE}clients:\n- {{name: c, address: 100.64.0.9, network: elsewhere}}\n"));
        assert_eq!(e, "t.yaml: field clients[0].network: no node is on network \"elsewhere\"");
        let e = error(&format!("{NODE}clients:\n- {{name: c, address: 10.9.0.9, network: underlay}}\n"));
        assert_eq!(e, "t.yaml: field clients[0].address: 10.9.0.9 is outside network underlay's segments");
        let two = "nodes:\n- name: a\n  podCidr: 10.244.1.0/24\n  underlay: {address: 10.1.0.2/24}\n  nat: {kind: oneToOne, public: 100.64.0.3/16}\n- name: a-nat\n  podCidr: 10.244.2.0/24\n  underlay: {address: 100.64.0.4/16}\n";
        assert_eq!(error(two), "t.yaml: field nodes: \"a-nat\" names two hosts (a NAT router is <node>-nat)");
    }

    #[test]
    fn ipv6_parses_and_pods_take_their_node_prefix() {
        let t = Topology::default_lab();
        let edge = t.node("edge-a").unwrap();
        assert_eq!(edge.public[0].address6.unwrap().to_string(), "2001:db8::9/64");
        assert_eq!(t.public_address6("edge-a", "enp1s0"), Some("2001:db8::9".parse().unwrap()));
        assert_eq!(t.public_address6("worker-2", "enp1s0"), None, "worker-2's own connection stays IPv4");
        assert_eq!(t.client("client-1").unwrap().address6, Some("2001:db8:100::7".parse().unwrap()));
        let six = |pod: &str| t.pod_address6(t.pod(pod).unwrap()).map(|a| a.to_string());
        assert_eq!(six("game-0").as_deref(), Some("fd10:244:2::6b"), "10.244.2.107 is offset 107 in its /24");
        assert_eq!(six("web-0").as_deref(), Some("fd10:244:18::7"));
        assert_eq!(router6(edge).map(|a| a.to_string()).as_deref(), Some("fd10:244:18::1"));
        let multi = Topology::multi_lab();
        assert_eq!(
            multi.pod_address6(multi.pod("dns-0").unwrap()).map(|a| a.to_string()).as_deref(),
            Some("fd10:244:1::35")
        );
        // Without a podCidr6 a pod has no IPv6 address; the overlay's topologies stay IPv4.
        assert!(Topology::sites_lab().pods.iter().all(|p| Topology::sites_lab().pod_address6(p).is_none()));
        let node = "nodes:\n- name: a\n  podCidr: 10.244.1.0/24\n  podCidr6: fd10:1::/64\n  underlay: {address: 100.64.0.1/16, address6: \"2001:db8:64::1/64\"}\n  public: [{interface: enp1s0, address: 203.0.113.9/24, address6: \"2001:db8::9/64\"}]\n";
        let full = format!(
            "{node}pods:\n- {{name: p, namespace: n, node: a, address: 10.244.1.5}}\nclients:\n- {{name: c, address: 198.51.100.7, address6: \"2001:db8:100::7\", attach: [a/enp1s0]}}\n- {{name: d, address: 100.64.0.9, address6: \"2001:db8:64::9\", network: underlay}}\n"
        );
        let t = Topology::parse("t.yaml", &full).unwrap();
        assert_eq!(t.pod_address6(t.pod("p").unwrap()), Some("fd10:1::5".parse().unwrap()));
        assert_eq!(t.segments6("underlay"), ["2001:db8:64::/64".parse::<Ipv6Net>().unwrap()]);
        assert_eq!(Topology::parse("x", &t.to_yaml()).unwrap(), t, "round trip");
        // Errors name the field.
        let e = error(&node.replace("2001:db8::9/64", "203.0.113.10/24"));
        assert!(e.contains("field nodes[0].public[0].address6: \"203.0.113.10/24\" is not an IPv6 address"), "{e}");
        let e = error(&node.replace("fd10:1::/64", "fd10:1::/124"));
        assert_eq!(e, "t.yaml: field nodes[0].podCidr6: fd10:1::/124 is smaller than the pod CIDR 10.244.1.0/24");
        let e = error(&node.replace("address6: \"2001:db8::9/64\"", "address6: \"2001:db8::9/127\""));
        assert!(e.contains("field nodes[0].public[0].address6: 2001:db8::9/127: use a prefix of /126 or wider"), "{e}");
        let e = error(&format!(
            "{node}clients:\n- {{name: c, address: 1.2.3.4, address6: \"fd10:1::9\", attach: [a/enp1s0]}}\n"
        ));
        assert_eq!(e, "t.yaml: field clients[0].address6: fd10:1::9 is inside node a's IPv6 pod prefix");
        let e = error(&format!(
            "{NODE}  public: [{{interface: enp1s0, address: 203.0.113.9/24}}]\nclients:\n- {{name: c, address: 1.2.3.4, address6: \"2001:db8::7\", attach: [a/enp1s0]}}\n"
        ));
        assert_eq!(e, "t.yaml: field clients[0].address6: none of the client's attachments has an IPv6 address");
        let e = error(&format!(
            "{node}clients:\n- {{name: c, address: 100.64.0.9, address6: \"2001:db8:65::9\", network: underlay}}\n"
        ));
        assert_eq!(e, "t.yaml: field clients[0].address6: 2001:db8:65::9 is outside network underlay's IPv6 segments");
        let e = error(&format!(
            "{node}- name: b\n  podCidr: 10.244.2.0/24\n  podCidr6: fd10:1::/80\n  underlay: {{address: 100.64.0.2/16}}\n"
        ));
        assert_eq!(e, "t.yaml: field nodes[1].podCidr6: fd10:1::/80 overlaps node a's IPv6 pod prefix");
    }

    #[test]
    fn ports_parse() {
        assert_eq!("27015-27115".parse::<Ports>().unwrap().len(), 101);
        assert_eq!("80".parse::<Ports>().unwrap(), Ports { first: 80, last: 80 });
        assert!("0".parse::<Ports>().is_err());
        assert!("70000".parse::<Ports>().is_err());
    }
}
