//! The overlay capability: kuport's own WireGuard mesh between nodes (docs/overlay/mesh.md).
//!
//! Off unless [`OverlaySettings`] are given. Two stages:
//!
//! 1. [`plan`], once for the mesh: [`members`], which nodes are in it (a valid public key from
//!    the node's own stream, pod CIDRs that overlap no one's, an endpoint that parses) and why
//!    the others are not, with each member's endpoint candidates; what the members' reports
//!    told ([`heard`]); and with [`relays`], which pairs go through a relay and which one
//!    (docs/overlay/relays.md).
//! 2. [`member`], per member: its device, one peer per other member, its overlay address, the
//!    routes of the other members' pod addresses through the device, and its MTU.
//!
//! The executor's half (keys, the device, peer-by-peer changes) is docs/overlay/node.md.

pub mod heard;
pub mod members;
pub mod relays;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use kuport_proto::shared::Shared;
use kuport_proto::v1::{
    Address, ChainPolicy, ChainType, Hook, NetnsState, NftFamily, NftRule, NftSet, NftTable, NftType, NodeState, Route,
    Sysctl, WireguardPeer,
};
use kuport_proto::wireguard::Peers;

use crate::compute::numbers::MAIN_TABLE;
use crate::observe::Cluster;

/// The device's default name: under kuport's link prefix, so the executor owns it (and its
/// addresses and routes) as it owns its VXLAN links, whose names are `kup-` and 8 hex digits.
pub const DEFAULT_INTERFACE: &str = "kup-wg";
/// WireGuard's customary port.
pub const DEFAULT_LISTEN_PORT: u16 = 51820;
/// On every peer: a node behind NAT sends first and keeps its mapping open (the overlay note).
pub const KEEPALIVE_SECONDS: u16 = 25;
/// WireGuard's overhead over an IPv4 underlay: 20 (IP) + 8 (UDP) + 32 (WireGuard header and tag).
pub const OVERHEAD_IPV4: u32 = 60;
/// Over IPv6: a 40-byte IP header.
pub const OVERHEAD_IPV6: u32 = 80;
/// The operator's endpoint for a node (IP, IP:port or [IPv6]:port): a cloud VM whose own address
/// is private behind a 1:1 NAT (the overlay note's `--node-external-ip`). Read, never written.
pub const EXTERNAL_ENDPOINT_ANNOTATION: &str = "kuport.wlz.li/external-endpoint";
/// Published by the controller on each member's Node ([`annotations`]): its public key.
pub const PUBLIC_KEY_ANNOTATION: &str = "kuport.wlz.li/wireguard-public-key";
/// Published likewise: the endpoint its peers dial, as computed. A key of its own, so the
/// controller never reads back what it wrote as an override.
pub const ENDPOINT_ANNOTATION: &str = "kuport.wlz.li/wireguard-endpoint";
/// The annotations a Node watch compares (`observe::index::node_inputs`), so that one removed
/// by hand wakes the status writer.
pub const PUBLISHED_ANNOTATIONS: [&str; 2] = [PUBLIC_KEY_ANNOTATION, ENDPOINT_ANNOTATION];
/// Published likewise: how the member's pod traffic reaches each peer, a compact JSON object of
/// peer name to `direct`, `via RELAY` or `unreachable` (docs/overlay/relays.md).
pub const ROUTES_ANNOTATION: &str = "kuport.wlz.li/wireguard-routes";
/// Published likewise: what the member's own executor last reported of each peer, a compact JSON
/// object of peer name to its state (`direct`, `unreachable` or `unknown`) and the endpoint its
/// WireGuard holds (docs/overlay/relays.md).
pub const PEERS_ANNOTATION: &str = "kuport.wlz.li/wireguard-peers";
/// Written by the controller on each member's Node: [`key_tag`] of its public key. A key whose
/// tag is on a Node is held by that Node: another node that reports it is refused, and the holder
/// keeps its place (docs/overlay/mesh.md, "Who holds a key"). A label under NodeRestriction's
/// prefix, so that no kubelet can set, change or remove it on its own Node; written for members
/// only and never removed, so a holder that leaves the mesh for a while keeps its key held.
pub const KEY_HELD_LABEL: &str = "node-restriction.kubernetes.io/kuport-key";
/// Every annotation the controller writes on a Node (and removes when it leaves the mesh).
pub const WRITTEN_ANNOTATIONS: [&str; 4] =
    [PUBLIC_KEY_ANNOTATION, ENDPOINT_ANNOTATION, PEERS_ANNOTATION, ROUTES_ANNOTATION];

/// The overlay's own nftables table on every member: inet, so that IPv6 pod traffic is held to
/// the same rules. Under the executor's table prefix (`kuport_proto::owned`), so it owns it.
pub const NFT_TABLE: &str = kuport_proto::owned::OVERLAY_TABLE;
/// Its forward chain (docs/overlay/filter.md).
pub const FORWARD_CHAIN: &str = "forward";
pub const PODS_SET_V4: &str = kuport_proto::owned::OVERLAY_PODS_V4;
pub const PODS_SET_V6: &str = kuport_proto::owned::OVERLAY_PODS_V6;

const IPV4_FORWARDING: &str = kuport_proto::owned::SYSCTL_FORWARDING;
const IPV6_FORWARDING: &str = kuport_proto::owned::SYSCTL_FORWARDING6;

/// The overlay's settings; the overlay is on when the controller has them (`--overlay`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverlaySettings {
    /// The device on every node.
    pub interface: String,
    /// The UDP port every device listens on; an endpoint annotation may name another (a port
    /// forward).
    pub listen_port: u16,
}

impl Default for OverlaySettings {
    fn default() -> Self {
        OverlaySettings { interface: DEFAULT_INTERFACE.into(), listen_port: DEFAULT_LISTEN_PORT }
    }
}

/// Settings the controller refuses to start with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "overlay interface {0:?}: must start with {prefix:?} (the executor owns only those links) and be a Linux interface name of at most 15 bytes",
        prefix = kuport_proto::owned::LINK_PREFIX
    )]
    Interface(String),
    #[error("overlay listen port 0: a peer needs a fixed port to send to")]
    ListenPort,
}

impl OverlaySettings {
    pub fn new(interface: &str, listen_port: u16) -> Result<Self, SettingsError> {
        let owned = interface.starts_with(kuport_proto::owned::LINK_PREFIX)
            && interface.len() > kuport_proto::owned::LINK_PREFIX.len();
        if !owned || !crate::observe::facts::valid_interface_name(interface) {
            return Err(SettingsError::Interface(interface.to_string()));
        }
        if listen_port == 0 {
            return Err(SettingsError::ListenPort);
        }
        Ok(OverlaySettings { interface: interface.to_string(), listen_port })
    }
}

/// Every reason a node is not in the mesh.
pub mod reason {
    /// The executor has not reported a key (not yet connected, or an executor without the
    /// overlay); not an error, but the node is no one's peer until it does.
    pub const NO_PUBLIC_KEY: &str = "NoPublicKey";
    /// Not 32 bytes of base64.
    pub const INVALID_PUBLIC_KEY: &str = "InvalidPublicKey";
    /// Another node reports the same key, and no Node holds it.
    pub const PUBLIC_KEY_CLASH: &str = "PublicKeyClash";
    /// Another Node holds the key (its [`super::KEY_HELD_LABEL`]): only this node is refused.
    pub const PUBLIC_KEY_HELD: &str = "PublicKeyHeld";
    /// spec.podCIDRs is empty.
    pub const NO_POD_CIDRS: &str = "NoPodCIDRs";
    /// A pod CIDR does not parse or has host bits set.
    pub const INVALID_POD_CIDR: &str = "InvalidPodCIDR";
    /// A pod CIDR overlaps another node's.
    pub const POD_CIDR_OVERLAP: &str = "PodCIDROverlap";
    /// The endpoint annotation does not parse.
    pub const INVALID_ENDPOINT: &str = "InvalidEndpoint";
}

/// Why a node is not in the mesh: the node, the field (of its report or its Node), why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: node {node}: {field}: {message}")]
pub struct Refusal {
    pub node: String,
    pub field: String,
    /// One of [`reason`].
    pub reason: &'static str,
    pub message: String,
}

/// One node's place in the mesh, for the Debug service and status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeOverlay {
    /// Set for members only.
    pub public_key: Option<String>,
    pub endpoint: Option<SocketAddr>,
    pub pod_cidrs: Vec<IpNet>,
    /// The device's address ([`overlay_address`]); None for a node without an IPv4 pod CIDR.
    pub address: Option<Ipv4Addr>,
    pub mtu: u32,
    /// Empty for a member.
    pub refused: Vec<Refusal>,
    /// A relay candidate ([`relays::is_candidate`]).
    pub relay: bool,
    /// Per peer (every other member, [`NodeOverlay::peers`]), how this member's pod traffic
    /// reaches it. Made from the plan's map of every member, direct, so members share all but
    /// the entries that differ ([`member`]).
    pub routes: imbl::OrdMap<String, relays::PeerRoute>,
    /// This member's executor's last report of its peers, by key, shared with the observed
    /// cluster: what it says of each peer is read from it by the peer's key when asked
    /// ([`seen_of`]), so a place holds no entry per peer for it.
    pub report: Option<Arc<crate::observe::SeenPeers>>,
}

impl NodeOverlay {
    /// The other members, which are this node's peers, in name order.
    pub fn peers(&self) -> impl Iterator<Item = &String> {
        self.routes.keys()
    }
}

/// What a member's executor last reported of one peer: unknown, with no endpoint, until a
/// report names it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerSeen {
    pub reach: kuport_proto::v1::Reach,
    pub endpoint: Option<SocketAddr>,
}

/// Every Node's place in the mesh, by name; a member's shared by the computes that did not
/// change it.
pub type Places = BTreeMap<String, Arc<NodeOverlay>>;

/// What member `node`'s executor last reported of its peer `peer` (by the key `peer` holds in
/// `nodes`): unknown, with no endpoint, until a report names it. None unless both are members.
pub fn seen_of(nodes: &Places, node: &str, peer: &str) -> Option<PeerSeen> {
    let o = nodes.get(node).filter(|o| o.routes.contains_key(peer))?;
    seen_by(nodes, o, peer)
}

/// What `o`'s report says of its peer `peer`, found by its key in `nodes`.
fn seen_by(nodes: &Places, o: &NodeOverlay, peer: &str) -> Option<PeerSeen> {
    let key = nodes.get(peer)?.public_key.as_deref()?;
    Some(seen(o.report.as_ref(), key))
}

/// The overlay address of a node with `pod_cidrs`: the first address of its first IPv4 pod
/// CIDR. Derived, not allocated: nothing to persist, every replica and every failover computes
/// the same, it is unique as long as pod CIDRs do not overlap (refused), host-local IPAM never
/// hands out a prefix's first address, and flannel gives its own device the same one. IPv4 only:
/// IPv6's first address is the subnet-router anycast address, and kuport's links are IPv4.
pub fn overlay_address(pod_cidrs: &[IpNet]) -> Option<Ipv4Addr> {
    pod_cidrs.iter().find_map(|c| match c {
        IpNet::V4(n) => Some(n.network()),
        IpNet::V6(_) => None,
    })
}

/// What the mesh decides once for all its members: who they are and where each may be reached,
/// and which pairs go through a relay. Each member's part follows from it and from the member's
/// own reports ([`member`]).
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub judged: members::Judged,
    /// What the members' reports told, kept for the next plan ([`replan`]).
    pub heard: heard::Heard,
    pub routes: relays::Routes,
    /// Every member's pod addresses, as the fewest prefixes ([`cidrs_of`]): the filter's sets
    /// and, less a member's own, its routes. Shared like the members.
    pub member_cidrs: Arc<Vec<IpNet>>,
    /// The filter table of a member and of a relay candidate ([`filter_table`],
    /// [`relay_filter_table`]) over `member_cidrs`, canonical: made once and shared by every
    /// member's state.
    pub filters: Filters,
    /// Every member, reached directly: what each member's place's routes are made from.
    pub all_direct: imbl::OrdMap<String, relays::PeerRoute>,
}

/// A member's filter table, and a relay candidate's, each the one table of a namespace's list
/// of tables.
#[derive(Debug, Default, PartialEq, Clone)]
pub struct Filters {
    pub member: Shared<NftTable>,
    pub relay: Shared<NftTable>,
}

impl Filters {
    fn new(interface: &str, cidrs: &[IpNet]) -> Filters {
        let canonical = |table: NftTable| {
            let mut ns = NetnsState { nft_tables: vec![table].into(), ..Default::default() };
            kuport_proto::canonical::canonicalize_netns_whole(&mut ns);
            ns.nft_tables
        };
        Filters {
            member: canonical(filter_table(interface, cidrs)),
            relay: canonical(relay_filter_table(interface, cidrs)),
        }
    }
}

impl Plan {
    /// The members on either side of a pair whose route differs between the two plans: only
    /// their own parts hold their routes (a relay's entries do not depend on whom it carries).
    pub fn rerouted(&self, other: &Plan) -> BTreeSet<String> {
        let (a, b) = (&self.routes.not_direct, &other.routes.not_direct);
        let changed = |(p, r): (&relays::Pair, &relays::PeerRoute),
                       them: &BTreeMap<relays::Pair, relays::PeerRoute>| {
            (them.get(p) != Some(r)).then(|| [p.0.clone(), p.1.clone()])
        };
        a.iter().filter_map(|e| changed(e, b)).chain(b.iter().filter_map(|e| changed(e, a))).flatten().collect()
    }
}

/// The mesh's [`Plan`] for `cluster`.
pub fn plan(cluster: &Cluster, settings: &OverlaySettings) -> Plan {
    let (judged, heard) = members::judge_and_hear(cluster, settings);
    let member_cidrs = Arc::new(cidrs_of(&judged.members));
    let filters = Filters::new(&settings.interface, &member_cidrs);
    let routes = routes(&judged, &heard);
    let all_direct = judged.members.keys().map(|n| (n.clone(), relays::PeerRoute::Direct)).collect();
    Plan { judged, heard, routes, member_cidrs, filters, all_direct }
}

/// The plan for `cluster` from `last`, the plan for `was`, whose Nodes, facts and refused facts
/// (all that judges the members) did not change: the members stand; the reports that changed
/// are heard again, and only the members whose learned endpoints or connect address changed
/// have their candidates made again. Equal to [`plan`] (`compute::by_change`'s tests).
pub fn replan(last: &Plan, was: &Cluster, cluster: &Cluster, settings: &OverlaySettings) -> Plan {
    let mut heard = last.heard.clone();
    let members = &last.judged.members;
    let mut touched = heard.hear(cluster, members);
    let (a, b) = (&was.overlay_observed.connect_addresses, &cluster.overlay_observed.connect_addresses);
    touched.extend(members.keys().filter(|n| a.get(*n) != b.get(*n)).cloned());
    let candidates = match touched.is_empty() {
        true => last.judged.candidates.clone(),
        false => {
            let nodes = members::node_index(cluster);
            candidates_again(&last.judged.candidates, cluster, &nodes, &heard, settings, members, &touched)
        }
    };
    let judged = members::Judged { members: members.clone(), refused: last.judged.refused.clone(), candidates };
    let routes = routes(&judged, &heard);
    Plan {
        judged,
        heard,
        routes,
        member_cidrs: last.member_cidrs.clone(),
        filters: last.filters.clone(),
        all_direct: last.all_direct.clone(),
    }
}

/// The plan for `cluster` from `last`, the plan for `was`, when what judges the members
/// changed (Nodes, facts): the members are judged again, and when they are the same nodes
/// what the reports told is kept, followed to the members' new keys ([`heard::Heard::rekey`]),
/// and heard again only where a report changed. Only the members whose Node, connect address
/// or learned endpoints changed have their candidates made again. A new set of members is
/// planned from nothing ([`plan`]). Equal to [`plan`] (`compute::by_change`'s tests).
pub fn rejudge(last: &Plan, was: &Cluster, cluster: &Cluster, settings: &OverlaySettings) -> Plan {
    let mut judged = members::judge_members(cluster, settings);
    let (old, new) = (&last.judged.members, &judged.members);
    if !old.keys().eq(new.keys()) {
        return plan(cluster, settings);
    }
    let mut heard = last.heard.clone();
    let mut touched = heard.rekey(cluster, old, new);
    touched.extend(heard.hear(cluster, new));
    let (a, b) = (&was.overlay_observed.connect_addresses, &cluster.overlay_observed.connect_addresses);
    let (nodes_was, nodes) = (members::node_index(was), members::node_index(cluster));
    let same_node = |n: &str| match (nodes_was.get(n), nodes.get(n)) {
        (Some(x), Some(y)) => std::ptr::eq(*x, *y) || x == y,
        (x, y) => x.is_none() && y.is_none(),
    };
    // A member's candidates read its Node (its endpoint, annotations and addresses), its
    // connect address and what was learned of it, never its key.
    touched.extend(new.keys().filter(|n| a.get(*n) != b.get(*n) || !same_node(n)).cloned());
    judged.candidates = candidates_again(&last.judged.candidates, cluster, &nodes, &heard, settings, new, &touched);
    let (member_cidrs, filters) = if old.iter().zip(new.iter()).all(|((_, x), (_, y))| x.pod_cidrs == y.pod_cidrs) {
        (last.member_cidrs.clone(), last.filters.clone())
    } else {
        let cidrs = Arc::new(cidrs_of(&judged.members));
        let filters = Filters::new(&settings.interface, &cidrs);
        (cidrs, filters)
    };
    let routes = routes(&judged, &heard);
    // The same members: the same map.
    Plan { judged, heard, routes, member_cidrs, filters, all_direct: last.all_direct.clone() }
}

/// `last`'s candidates, made again for the members in `touched`: the others read nothing that
/// changed.
fn candidates_again(
    last: &BTreeMap<String, Vec<SocketAddr>>,
    cluster: &Cluster,
    nodes: &BTreeMap<&str, &k8s_openapi::api::core::v1::Node>,
    heard: &heard::Heard,
    settings: &OverlaySettings,
    members: &BTreeMap<String, members::Member>,
    touched: &BTreeSet<String>,
) -> BTreeMap<String, Vec<SocketAddr>> {
    let mut candidates = last.clone();
    for name in touched {
        if let Some(m) = members.get(name) {
            let c = members::candidates_of(cluster, nodes, heard, settings.listen_port, name, m);
            candidates.insert(name.clone(), c);
        }
    }
    candidates
}

/// Every member's pod addresses as the fewest prefixes, in order (IPv4 first): adjacent pod
/// CIDRs merged, as a node IPAM that hands them out of one cluster CIDR makes most of them. The
/// same addresses as the pod CIDRs themselves, in a few entries whatever the mesh's size
/// (docs/decisions.md, "Routes and sets of the members' aggregated pod CIDRs").
fn cidrs_of(members: &BTreeMap<String, members::Member>) -> Vec<IpNet> {
    let cidrs: Vec<IpNet> = members.values().flat_map(|m| m.pod_cidrs.iter().copied()).collect();
    IpNet::aggregate(&cidrs)
}

/// The IPv4 prefixes of `all` (aggregated, [`cidrs_of`]) less the addresses of `own`, as the
/// fewest prefixes: the routes of every other member's pods on a member whose pod CIDRs are
/// `own` (members' pod CIDRs never overlap, so each of `own` lies within one of `all`).
pub fn others_v4(all: &[IpNet], own: &[IpNet]) -> Vec<ipnet::Ipv4Net> {
    let v4 = |c: &IpNet| match c {
        IpNet::V4(n) => Some(*n),
        IpNet::V6(_) => None,
    };
    let mut out: Vec<ipnet::Ipv4Net> = all.iter().filter_map(v4).collect();
    for hole in own.iter().filter_map(v4) {
        out = out.into_iter().flat_map(|p| without(p, hole)).collect();
    }
    out.sort();
    out
}

/// `p` less `hole`: `p` itself when it does not contain `hole`, else the halves beside the
/// path from `p` down to `hole`, the fewest prefixes that cover the rest.
fn without(p: ipnet::Ipv4Net, hole: ipnet::Ipv4Net) -> Vec<ipnet::Ipv4Net> {
    if !p.contains(&hole) {
        return vec![p];
    }
    let mut rest = Vec::new();
    let mut at = p;
    while at.prefix_len() < hole.prefix_len() {
        let Ok(mut halves) = at.subnets(at.prefix_len() + 1) else { break };
        let (Some(a), Some(b)) = (halves.next(), halves.next()) else { break };
        let (into, beside) = if a.contains(&hole) { (a, b) } else { (b, a) };
        rest.push(beside);
        at = into;
    }
    rest
}

/// Every pair's route, from the relay candidates among the members and the broken pairs.
fn routes(judged: &members::Judged, heard: &heard::Heard) -> relays::Routes {
    let candidates: BTreeSet<String> = judged.members.iter().filter(|(_, m)| m.relay).map(|(n, _)| n.clone()).collect();
    relays::decide(&candidates, &heard.broken())
}

/// A refused node's place: why it is not in the mesh.
pub fn refused_place(why: &[Refusal]) -> NodeOverlay {
    NodeOverlay { refused: why.to_vec(), ..Default::default() }
}

/// Member `name`'s device and peers, its part of its host namespace, and its place; `node_mtu`
/// is its node's MTU (the device's is smaller by WireGuard's overhead). It reads of the cluster
/// only `name`'s own reports and the clock (`compute::by_change` keeps it while they hold).
pub fn member(
    cluster: &Cluster,
    settings: &OverlaySettings,
    (plan, base): (&Plan, &Peers),
    name: &str,
    node_mtu: u32,
) -> Option<(NetnsState, NodeOverlay)> {
    let judged = &plan.judged;
    let me = judged.members.get(name)?;
    let others: Vec<(&String, &members::Member)> = judged.members.iter().filter(|(n, _)| *n != name).collect();
    // One MTU for the device: the outer header is IPv6 if any path may be.
    let v6 = me.endpoint.iter().chain(others.iter().filter_map(|(_, m)| m.endpoint.as_ref())).any(|e| e.is_ipv6());
    let mtu = node_mtu.saturating_sub(if v6 { OVERHEAD_IPV6 } else { OVERHEAD_IPV4 });
    let entries = relays::entries(name, &judged.members, &plan.routes);
    // Every other member's shared entry, and an own one where it differs.
    let mut peers = base.clone();
    peers.remove(&me.public_key)?;
    for (other, m) in &others {
        // Its pod CIDRs, or for a relayed peer its overlay address only, and what it
        // relays (docs/overlay/relays.md). Its endpoint: a candidate, rotating while
        // silent (docs/overlay/status.md).
        let endpoint = members::endpoint_for(cluster, &judged.members, &judged.candidates, name, other);
        let e = entries.get(other.as_str()).cloned().unwrap_or_default();
        let mut p = kuport_proto::build::wireguard_peer(&m.public_key, endpoint, &e.allowed_ips, e.keepalive);
        p.probe_address = e.probe.map(|a| a.to_string()).unwrap_or_default();
        kuport_proto::canonical::order_prefixes(&mut p.allowed_ips);
        if base.get(&m.public_key) != Some(&p) {
            peers.insert(p);
        }
    }
    let device = kuport_proto::build::wireguard_device(&settings.interface, mtu, settings.listen_port, peers);
    let address = overlay_address(&me.pod_cidrs);
    let mut ns = NetnsState {
        wireguard_devices: vec![device],
        nft_tables: if me.relay { plan.filters.relay.clone() } else { plan.filters.member.clone() },
        ..Default::default()
    };
    ns.sysctls.push(Sysctl { key: IPV4_FORWARDING.into(), value: "1".into() });
    if me.pod_cidrs.iter().any(|c| matches!(c, IpNet::V6(_))) {
        ns.sysctls.push(Sysctl { key: IPV6_FORWARDING.into(), value: "1".into() });
    }
    if let Some(a) = address {
        ns.addresses.push(Address { dev: settings.interface.clone(), cidr: format!("{a}/32") });
    }
    // Routes of the families this node's pods have: no one here could use the others. IPv4
    // only for now: the executor's routes are IPv4 (dual-stack is issue 19), and one IPv6
    // route would refuse the node's whole state (`overlay_root.rs` found it). Every other
    // member's pod addresses, as the fewest prefixes: WireGuard's allowed IPs, not the route,
    // choose the peer.
    if me.pod_cidrs.iter().any(|c| matches!(c, IpNet::V4(_))) {
        for dst in others_v4(&plan.member_cidrs, &me.pod_cidrs) {
            ns.routes.push(Route {
                table: MAIN_TABLE,
                dst: dst.to_string(),
                via: String::new(),
                dev: settings.interface.clone(),
            });
        }
    }
    let report = cluster.overlay_observed.reports.get(name);
    // Every other member direct, then this member's pairs that are not: found among those
    // pairs or among its peers, whichever are fewer, so a mesh of many relayed pairs costs
    // each member no more than a lookup per peer.
    let mut routes = plan.all_direct.clone();
    routes.remove(name);
    let not_direct = &plan.routes.not_direct;
    if not_direct.len() <= others.len() {
        for ((a, b), route) in not_direct.iter().filter(|((a, b), _)| a == name || b == name) {
            let other = if a == name { b } else { a };
            if routes.contains_key(other) {
                routes.insert(other.clone(), route.clone());
            }
        }
    } else {
        for (other, _) in &others {
            let route = plan.routes.route(name, other);
            if route != relays::PeerRoute::Direct {
                routes.insert((*other).clone(), route);
            }
        }
    }
    let place = NodeOverlay {
        public_key: Some(me.public_key.clone()),
        endpoint: me.endpoint,
        pod_cidrs: me.pod_cidrs.clone(),
        address,
        mtu,
        refused: Vec::new(),
        relay: me.relay,
        routes,
        report: report.cloned(),
    };
    Some((ns, place))
}

/// What a member's `report` says of the peer holding `key`.
fn seen(report: Option<&Arc<crate::observe::SeenPeers>>, key: &str) -> PeerSeen {
    let p = report.and_then(|r| r.get(key));
    PeerSeen { reach: p.map_or(kuport_proto::v1::Reach::Unknown, |p| p.reach), endpoint: p.and_then(|p| p.endpoint) }
}

/// The members whose peer entry is all that differs, in the other members' parts, between
/// plans `old` and `new`: those whose key, announced endpoint or candidates changed. None when
/// a difference reaches more of every part: another set of members, a member's pod CIDRs (its
/// peers' allowed IPs, their routes and filter), or an IPv6 endpoint that comes or goes (every
/// device's MTU, [`member`]). Routes, which relay candidates decide, are the caller's, pair by
/// pair ([`Plan::rerouted`]).
pub fn repeered(old: &Plan, new: &Plan) -> Option<BTreeSet<String>> {
    let (a, b) = (&old.judged, &new.judged);
    if a.members.len() != b.members.len() || any_ipv6_endpoint(a) != any_ipv6_endpoint(b) {
        return None;
    }
    let mut changed = BTreeSet::new();
    for ((name, was), (other, is)) in a.members.iter().zip(b.members.iter()) {
        if name != other || was.pod_cidrs != is.pod_cidrs {
            return None;
        }
        if was != is || a.candidates.get(name) != b.candidates.get(name) {
            changed.insert(name.clone());
        }
    }
    Some(changed)
}

fn any_ipv6_endpoint(judged: &members::Judged) -> bool {
    judged.members.values().any(|m| m.endpoint.is_some_and(|e| e.is_ipv6()))
}

/// Member `name`'s part under `plan` from `old`, its part under an earlier plan from which
/// only the members in `changed` differ ([`repeered`], none of them `name`), with `name`'s own
/// reports and routes the same: their peer entries take their new key and endpoint. What else
/// the part holds read nothing that changed, and its place stays (its report is read by the
/// peers' keys when asked, [`seen_of`]). None when a peer is not where `old` should hold it.
pub fn repeer(
    cluster: &Cluster,
    (last, plan, base): (&Plan, &Plan, &Peers),
    name: &str,
    (old, place): (&NetnsState, &NodeOverlay),
    changed: &BTreeSet<String>,
) -> Option<NetnsState> {
    let mut ns = old.clone();
    let judged = &plan.judged;
    let peers = &mut ns.wireguard_devices.first_mut()?.peers;
    // All taken out before any is put back: a member's new key may be another's old one.
    let mut entries = Vec::with_capacity(changed.len());
    for other in changed {
        if !place.routes.contains_key(other) {
            return None;
        }
        let old_key = &last.judged.members.get(other)?.public_key;
        entries.push((other, peers.remove(old_key)?));
    }
    for (other, entry) in entries {
        let m = judged.members.get(other)?;
        let endpoint = members::endpoint_for(cluster, &judged.members, &judged.candidates, name, other);
        let mut peer = Arc::unwrap_or_clone(entry);
        peer.public_key.clone_from(&m.public_key);
        peer.endpoint = endpoint.map(|e| e.to_string()).unwrap_or_default();
        match base.get_shared(&m.public_key).filter(|b| ***b == peer) {
            Some(shared) => peers.insert_shared(shared.clone()),
            None => peers.insert(peer),
        };
    }
    Some(ns)
}

/// `state`, the node state that held a member's last part, with the peer entries of the
/// members in `changed` taken from `part`, its part under `plan` made by [`repeer`] from that
/// one (under `last`): nothing else in the state differs, so its other namespaces, objects and
/// set digests stay, and its host namespace's version is made again. Canonical as the state
/// assembled from its parts would be. None when a peer is not where it should be.
pub fn repeer_state(
    state: &NodeState,
    settings: &OverlaySettings,
    last: &Plan,
    plan: &Plan,
    part: &NetnsState,
    changed: &BTreeSet<String>,
) -> Option<NodeState> {
    let new_peers = &part.wireguard_devices.first()?.peers;
    let mut state = state.clone();
    let host = state.netns.iter_mut().find(|ns| ns.target.is_none())?;
    let device = host.wireguard_devices.iter_mut().find(|d| d.name == settings.interface)?;
    // All taken out before any is put back: a member's new key may be another's old one.
    for other in changed {
        device.peers.remove(&last.judged.members.get(other)?.public_key)?;
    }
    for other in changed {
        let new_key = &plan.judged.members.get(other)?.public_key;
        // The part's entry itself: the state shares it.
        device.peers.insert_shared(new_peers.get_shared(new_key)?.clone());
    }
    host.version.clear();
    host.version = kuport_proto::canonical::netns_version(host);
    Some(state)
}

/// Every member's peer entry as a member that reaches it directly and has no report of it holds
/// it: its first endpoint candidate, its pod CIDRs, the keepalive, its overlay address to probe.
/// Members' devices share these entries and hold their own only where one differs ([`member`]),
/// so a mesh of N members holds about N entries, not N squared (docs/decisions.md, "Peers
/// shared between states").
pub fn base_peers(judged: &members::Judged) -> Peers {
    judged.members.iter().map(|(name, m)| base_peer(judged, name, m)).collect()
}

/// `last`, the base entries under plan `was`, with those of the members in `changed` (whose
/// key or candidates alone differ between the plans, [`repeered`]) made again under `judged`.
pub fn rebase_peers(
    last: &Peers,
    was: &members::Judged,
    judged: &members::Judged,
    changed: &BTreeSet<String>,
) -> Option<Peers> {
    let mut base = last.clone();
    for other in changed {
        base.remove(&was.members.get(other)?.public_key)?;
    }
    for other in changed {
        base.insert(base_peer(judged, other, judged.members.get(other)?));
    }
    Some(base)
}

fn base_peer(judged: &members::Judged, name: &str, m: &members::Member) -> WireguardPeer {
    let endpoint = judged.candidates.get(name).and_then(|c| c.first()).copied();
    let mut p = kuport_proto::build::wireguard_peer(&m.public_key, endpoint, &m.pod_cidrs, KEEPALIVE_SECONDS);
    p.probe_address = overlay_address(&m.pod_cidrs).map(|a| a.to_string()).unwrap_or_default();
    p
}

/// The overlay's table on a member (docs/overlay/filter.md): one forward chain that
///
/// 1. clamps the MSS of every SYN and SYN-ACK leaving through the device to the route's MTU, so
///    that pods whose interfaces keep a larger MTU (often 1500) open TCP connections whose
///    segments fit the overlay, with no reliance on ICMP making it back to the sender;
/// 2. drops, with a counter, whatever would leave through the device after arriving through
///    it: a node that is not a relay never forwards one peer's traffic to another. A relay's
///    accept (between pod addresses) goes between these two rules ([`relay_filter_table`]).
///
/// The clamp comes first because it ends nothing, and so that a relay's accepted SYNs are
/// clamped too.
///
/// After them, on every member, a counted drop of whatever arrives through the device for an
/// address outside the members' pod CIDRs (`pod_cidrs`, every member's: an interval set per
/// family, [`PODS_SET_V4`], and [`PODS_SET_V6`] when some pod CIDR is IPv6). WireGuard checks
/// only a packet's source; its destination is the sending peer's choice, and a peer that routes
/// an outside address to this node would otherwise leave through the node's own networks. So
/// no member is an open forwarder (`node-exec/tests/relay_filter_root.rs`).
pub fn filter_table(interface: &str, pod_cidrs: &[IpNet]) -> NftTable {
    forward_table(interface, pod_cidrs, false)
}

/// The overlay's table on a relay candidate (docs/overlay/relays.md): [`filter_table`] with,
/// between the clamp and the drop, an accept of what goes from one peer to another between
/// members' pod CIDRs (the same sets). Anything else from the device back into it is still
/// dropped.
pub fn relay_filter_table(interface: &str, pod_cidrs: &[IpNet]) -> NftTable {
    forward_table(interface, pod_cidrs, true)
}

fn forward_table(interface: &str, cidrs: &[IpNet], relay: bool) -> NftTable {
    use kuport_proto::build::{
        accept, addr, base_chain, counter, drop, eq, ifname, lookup, member, not_lookup, rule, set, table, tcp_flag,
        tcp_flags, tcp_mss_clamp,
    };
    use kuport_proto::v1::Selector;
    let dev = || ifname(interface);
    let mut rules: Vec<NftRule> = vec![rule(
        vec![eq(Selector::Oifname, dev()), tcp_flags(tcp_flag::SYN, tcp_flag::SYN | tcp_flag::RST)],
        vec![tcp_mss_clamp()],
    )];
    let mut sets: Vec<NftSet> = Vec::new();
    // The drop of what arrives for an address outside the members' pod CIDRs, after the drop
    // below.
    let mut outside: Vec<NftRule> = Vec::new();
    let v6 = cidrs.iter().any(|c| matches!(c, IpNet::V6(_)));
    let families = [
        (PODS_SET_V4, NftType::Ipv4Addr, Selector::IpSaddr, Selector::IpDaddr, true),
        (PODS_SET_V6, NftType::Ipv6Addr, Selector::Ip6Saddr, Selector::Ip6Daddr, v6),
    ];
    for (name, ty, saddr, daddr, wanted) in families {
        if !wanted {
            continue;
        }
        let elements = cidrs
            .iter()
            .filter(|c| matches!(c, IpNet::V6(_)) == (ty == NftType::Ipv6Addr))
            .map(|c| member(vec![addr(c)]))
            .collect();
        sets.push(NftSet { interval: true, ..set(name, &[ty], &[], elements) });
        if relay {
            rules.push(rule(
                vec![
                    eq(Selector::Iifname, dev()),
                    eq(Selector::Oifname, dev()),
                    lookup(&[saddr], name),
                    lookup(&[daddr], name),
                ],
                vec![counter(), accept()],
            ));
        }
        outside.push(rule(vec![eq(Selector::Iifname, dev()), not_lookup(&[daddr], name)], vec![counter(), drop()]));
    }
    rules.push(rule(vec![eq(Selector::Iifname, dev()), eq(Selector::Oifname, dev())], vec![counter(), drop()]));
    rules.extend(outside);
    let forward = base_chain(FORWARD_CHAIN, ChainType::Filter, Hook::Forward, 0, ChainPolicy::Accept, rules);
    table(NftFamily::Inet, NFT_TABLE, sets, vec![forward])
}

/// The annotations the controller publishes on each member's Node (report::status writes them),
/// so that `kubectl get node -o yaml` shows its key, the endpoint its peers dial, and how its
/// pod traffic reaches each peer ([`ROUTES_ANNOTATION`]). A member without a usable address has
/// no endpoint annotation. Non-members get none (their published ones are removed).
pub fn annotations(nodes: &Places) -> BTreeMap<String, BTreeMap<String, String>> {
    nodes
        .iter()
        .filter_map(|(n, o)| {
            let key = o.public_key.clone()?;
            let mut a = BTreeMap::from([(PUBLIC_KEY_ANNOTATION.to_string(), key)]);
            if let Some(e) = o.endpoint {
                a.insert(ENDPOINT_ANNOTATION.to_string(), e.to_string());
            }
            a.insert(ROUTES_ANNOTATION.to_string(), routes_json(&o.routes));
            a.insert(PEERS_ANNOTATION.to_string(), peers_json(nodes, n));
            Some((n.clone(), a))
        })
        .collect()
}

/// The value of [`KEY_HELD_LABEL`] for `key`: the first 30 bytes of its SHA-256 in hex (60
/// characters: a label value holds at most 63, and a key's base64 has `+`, `/` and `=`).
pub fn key_tag(key: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes()).iter().take(30).map(|b| format!("{b:02x}")).collect()
}

/// The labels the controller writes on each member's Node: [`KEY_HELD_LABEL`]. Never removed.
pub fn labels(nodes: &Places) -> BTreeMap<String, BTreeMap<String, String>> {
    nodes
        .iter()
        .filter_map(|(n, o)| {
            let key = o.public_key.as_deref()?;
            Some((n.clone(), BTreeMap::from([(KEY_HELD_LABEL.to_string(), key_tag(key))])))
        })
        .collect()
}

/// The [`ROUTES_ANNOTATION`]'s value: `{"cloud":"direct","home-b":"via cloud"}`, in name order.
pub fn routes_json(routes: &imbl::OrdMap<String, relays::PeerRoute>) -> String {
    let text: BTreeMap<&str, String> = routes.iter().map(|(p, r)| (p.as_str(), r.to_string())).collect();
    serde_json::to_string(&text).unwrap_or_default()
}

/// The [`PEERS_ANNOTATION`]'s value on member `node`, what its report says of each peer
/// ([`seen_of`]):
/// `{"cloud":{"endpoint":"203.0.113.7:51820","state":"direct"},"home-b":{"state":"unknown"}}`.
pub fn peers_json(nodes: &Places, node: &str) -> String {
    use kuport_proto::v1::Reach;
    // The member found once, not again for each of its peers: the status pass runs this for
    // every member.
    let peers = nodes.get(node).into_iter().flat_map(|o| o.peers().map(move |p| (o, p)));
    let text: serde_json::Map<String, serde_json::Value> = peers
        .filter_map(|(o, p)| Some((p, seen_by(nodes, o, p)?)))
        .map(|(p, s)| {
            let state = match s.reach {
                Reach::Direct => "direct",
                Reach::Unreachable => "unreachable",
                Reach::Unknown => "unknown",
            };
            let mut v = serde_json::Map::new();
            if let Some(e) = s.endpoint {
                v.insert("endpoint".into(), e.to_string().into());
            }
            v.insert("state".into(), state.into());
            (p.clone(), v.into())
        })
        .collect();
    serde_json::Value::Object(text).to_string()
}

/// The first of a member's [`debug_lines`].
pub const DEBUG_MEMBER: &str = "member";

/// The node's lines for the Debug service (NodeDebug.overlay in sync.proto): a member's
/// [`DEBUG_MEMBER`], then "name: value" lines (with `relay: candidate` on a relay candidate, and
/// `routes: PEER=ROUTE,...` once routes are computed); a refused node's "field: Reason: message"
/// lines.
pub fn debug_lines(o: &NodeOverlay) -> Vec<String> {
    if !o.refused.is_empty() {
        return o.refused.iter().map(|r| format!("{}: {}: {}", r.field, r.reason, r.message)).collect();
    }
    let or_dash = |v: Option<String>| v.filter(|v| !v.is_empty()).unwrap_or_else(|| "-".into());
    let cidrs: Vec<String> = o.pod_cidrs.iter().map(ToString::to_string).collect();
    let mut lines = vec![
        DEBUG_MEMBER.to_string(),
        format!("address: {}", or_dash(o.address.map(|a| a.to_string()))),
        format!("endpoint: {}", or_dash(o.endpoint.map(|e| e.to_string()))),
        format!("podCIDRs: {}", or_dash(Some(cidrs.join(",")))),
        format!("publicKey: {}", or_dash(o.public_key.clone())),
        format!("peers: {}", o.routes.len()),
    ];
    if o.relay {
        lines.push("relay: candidate".into());
    }
    if !o.routes.is_empty() {
        let routes: Vec<String> = o.routes.iter().map(|(p, r)| format!("{p}={r}")).collect();
        lines.push(format!("routes: {}", routes.join(",")));
    }
    lines
}

/// One line per node for goldens and tools: members with address, endpoint, MTU and peers (a
/// relay candidate marked `relay`, and the routes that are not direct: `routes b=via r`);
/// refused nodes with every reason.
pub fn summary(nodes: &Places) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (n, o) in nodes {
        if o.refused.is_empty() {
            let address = o.address.map_or("-".to_string(), |a| a.to_string());
            let endpoint = o.endpoint.map_or("-".to_string(), |e| e.to_string());
            let _ = write!(
                out,
                "{n}: member address {address} endpoint {endpoint} mtu {} peers {}",
                o.mtu,
                if o.routes.is_empty() { "-".to_string() } else { o.peers().cloned().collect::<Vec<_>>().join(",") }
            );
            if o.relay {
                out.push_str(" relay");
            }
            let not_direct: Vec<String> = o
                .routes
                .iter()
                .filter(|(_, r)| **r != relays::PeerRoute::Direct)
                .map(|(p, r)| format!("{p}={r}"))
                .collect();
            if !not_direct.is_empty() {
                let _ = write!(out, " routes {}", not_direct.join(","));
            }
            out.push('\n');
        }
        for r in &o.refused {
            let _ = writeln!(out, "{n}: refused {r}");
        }
    }
    out
}
