//! The rule shapes: where every nftables element, link, route and ip rule of a port map is
//! decided; docs/portmap/datapath.md explains each, with its measurement and its test.
//!
//! One table, `inet kuport`, with the chains at the priorities below (and the steering chain,
//! steer.rs). Every map and set that holds an address has an IPv6 twin named with a `6`, and
//! so has the rule that reads it; the rest serves both families. Mappings are elements of
//! maps and sets keyed by concatenations, never rules of their own, so a new connection costs
//! the same at 10 mappings as at 50,000 (one rule per mapping was measured 36 times slower).
//!
//! | chain      | hook, priority       | rule                                                      |
//! |------------|----------------------|-----------------------------------------------------------|
//! | kup-pre    | nat prerouting -110  | DNAT published ports (the node's address's stand-in, steer.rs) to the pod or the link's far end |
//! |            |                      | DNAT link arrivals (this end's stand-in, steer.rs) to the pod |
//! |            |                      | drop a new connection out of a link that nothing translated |
//! | kup-post   | nat postrouting 90   | identity SNAT claiming the request before the CNI's masquerade |
//! |            |                      | identity SNAT claiming the pod's reply into a kup- link   |
//! | kup-mangle | filter prerouting -140 | save the arrival link in ct mark (original direction)   |
//! |            |                      | Single: mark replies by that ct mark, pod address, protocol and port |
//! |            |                      | Multi: restore the ct mark on replies                     |
//! | kup-links  | filter input -10     | drop what reaches a link's VXLAN port from anyone but its peer |
//!
//! Single ports live in hash sets keyed in their natural order (interface or address first, the
//! port last); only ranges live in interval sets.
//! The kernel keeps a concatenated interval set as a pipapo set, where an element insert or
//! delete costs O(set size) in the commit: in a 50,000-element set about 1.3 ms and up to 13 ms,
//! against 0.04 to 0.17 ms in a hash set (`strace -T` on `nft add element`).
//!
//! Every interval set's key starts with its ports, unlike the natural order: a pipapo lookup narrows field by field, and with `cilium_host` or a link first every
//! lookup walked most of the set. At 50,000 mappings new flows ran at 8 to 33 % of the
//! 10-mapping rate in that order (docs/decisions.md).

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use kuport_proto::v1::{
    Address, BaseChain, ChainType, CmpOp, Compare, Counter, Hook, IpRule, L4Proto, Link, MapLookup, Nat, NatKind,
    Neighbour, NetnsState, NftChain, NftElement, NftFamily, NftMatch, NftRule, NftSet, NftStatement, NftTable, NftType,
    NftValue, PortRange, Route, Selector, SetLookup, SetMark, Sysctl, UdpFlows, Verdict, VerdictKind, Vxlan, link,
    nft_match, nft_statement, nft_value, set_mark,
};

use super::links::{LinkKey, LinkNumbers, VXLAN_OVERHEAD, VXLAN_TTL, device_name, link_mac, mac_text};
use super::placement::{Placement, l4};
use crate::api::ServingMode;
use crate::compute::numbers::{MAIN_TABLE, MARK_PREFIX, MARK_PREFIX_MASK, Rule};
use crate::observe::index::View;

pub const TABLE: &str = kuport_proto::owned::NFT_TABLE;
pub const CHAIN_PRE: &str = "kup-pre";
pub const CHAIN_POST: &str = "kup-post";
pub const CHAIN_MANGLE: &str = "kup-mangle";
/// nft's named priorities, as numbers.
pub const PRIORITY_DSTNAT: i32 = -100;
pub const PRIORITY_SRCNAT: i32 = 100;
pub const PRIORITY_MANGLE: i32 = -150;
/// kuport's chains sort just before the CNI's NAT (and kube-proxy's), so its claims win.
pub const PRE_PRIORITY: i32 = PRIORITY_DSTNAT - 10;
pub const POST_PRIORITY: i32 = PRIORITY_SRCNAT - 10;
/// After the CNI's own mangle rules, so kuport's mark is the last word.
pub const MANGLE_PRIORITY: i32 = PRIORITY_MANGLE + 10;

pub use kuport_proto::owned::{MAP_LINK_PORT, MAP_LINK_RANGE, MAP_PUBLISH_PORT, MAP_PUBLISH_RANGE};
/// Requests to claim before the CNI, single ports: (oifname, destination, proto, port).
pub const SET_CLAIM_PORT: &str = "claim_port";
/// Requests to claim before the CNI, ranges: (ports, oifname, destination, proto).
pub const SET_CLAIM_RANGE: &str = "claim_range";
/// Pod replies to claim, single ports: (pod, proto, port).
pub const SET_REPLY_CLAIM_PORT: &str = "reply_claim_port";
/// Pod replies to claim, ranges: (ports, pod, proto).
pub const SET_REPLY_CLAIM_RANGE: &str = "reply_claim_range";
/// Single, single ports: (pod, proto, port) to the link's mark.
pub const MAP_RETURN_MARK_PORT: &str = "return_mark_port";
/// Single, ranges: (ports, pod, proto) to the link's mark.
pub const MAP_RETURN_MARK_RANGE: &str = "return_mark_range";
/// Multi: the arrival link to its mark, saved in conntrack.
pub const MAP_CT_MARK: &str = "ct_mark";

const FORWARDING: &str = kuport_proto::owned::SYSCTL_FORWARDING;
const FORWARDING6: &str = kuport_proto::owned::SYSCTL_FORWARDING6;
/// IPv6 needs a link MTU of 1280 (RFC 8200): a thinner link carries IPv4 only.
pub const IPV6_MIN_MTU: u32 = 1280;
/// `ct direction reply` (IP_CT_DIR_REPLY).
const CT_DIRECTION_REPLY: u32 = 1;
/// `ct direction original` (IP_CT_DIR_ORIGINAL).
const CT_DIRECTION_ORIGINAL: u32 = 0;
/// Drops what reaches a link's VXLAN port from anyone but the link's peer, before decapsulation.
pub const CHAIN_LINKS: &str = "kup-links";
/// nft's `filter`, less 10: before a host firewall's input chain, so every refused packet is
/// counted here whatever the firewall does with it.
pub const LINKS_PRIORITY: i32 = -10;
/// The links' VXLAN ports on this node.
pub const SET_LINK_PORTS: &str = "link_ports";
/// (peer's underlay or overlay address, port) of each link on this node.
pub const SET_LINK_PEERS: &str = "link_peers";
/// This node's link devices, whose untranslated new connections kup-pre drops.
pub const SET_LINK_DEVICES: &str = "link_devices";

/// Each accepting interface's addresses.
type Addresses = BTreeMap<String, BTreeSet<IpAddr>>;

/// One end of a link, as one node sees it.
#[derive(Clone, Debug, Hash)]
pub struct LinkEnd {
    pub device: String,
    pub numbers: LinkNumbers,
    pub local_underlay: Ipv4Addr,
    pub peer_underlay: Ipv4Addr,
    pub address: Ipv4Addr,
    pub peer_address: Ipv4Addr,
    /// This end's and the far end's /127 addresses, when the link is thick enough for IPv6.
    pub address6: Option<Ipv6Addr>,
    pub peer_address6: Option<Ipv6Addr>,
    pub mtu: u32,
    /// This end's device MAC and the far end's, both computed from names ([`link_mac`]).
    pub mac: String,
    pub peer_mac: String,
}

impl LinkEnd {
    /// This end's and the far end's address of one family, if the link carries it.
    fn addresses(&self, fam: Family) -> Option<(IpAddr, IpAddr)> {
        match fam {
            Family::V4 => Some((self.address.into(), self.peer_address.into())),
            Family::V6 => Some((self.address6?.into(), self.peer_address6?.into())),
        }
    }

    pub fn new(view: &View, key: &LinkKey, numbers: &LinkNumbers, node: &str) -> Option<Self> {
        let peer = key.peer_of(node);
        let (me, them) = (view.node(node), view.node(peer));
        // Both ends in the mesh: the link rides on it, between overlay addresses; else on the
        // underlay. Both ends see the same pair, so they agree.
        let (local_underlay, peer_underlay, outer_mtu) = match (me.overlay, them.overlay) {
            (Some((mine, my_mtu)), Some((theirs, their_mtu))) => (mine, theirs, my_mtu.min(their_mtu)),
            _ => {
                let mtu = match them.underlay_mtu {
                    Some(p) => me.mtu().min(p),
                    None => me.mtu(),
                };
                (me.underlay?, them.underlay?, mtu)
            }
        };
        let mtu = outer_mtu.saturating_sub(VXLAN_OVERHEAD);
        let v6 = mtu >= IPV6_MIN_MTU;
        Some(LinkEnd {
            device: device_name(&key.class, peer),
            numbers: numbers.clone(),
            local_underlay,
            peer_underlay,
            address: numbers.address_of(key, node),
            peer_address: numbers.address_of(key, peer),
            address6: v6.then(|| numbers.address6_of(key, node)),
            peer_address6: v6.then(|| numbers.address6_of(key, peer)),
            mtu,
            mac: mac_text(link_mac(&key.class, node, peer)),
            peer_mac: mac_text(link_mac(&key.class, peer, node)),
        })
    }
}

type Ports = (u16, u16);

/// The address family of a group of elements and the rules that read them: IPv4's, or their
/// IPv6 twins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    pub fn holds(self, a: &IpAddr) -> bool {
        a.is_ipv6() == (self == Family::V6)
    }
    /// A map's or set's name in this family: the IPv6 twin ends in `6`.
    pub fn name(self, base: &str) -> String {
        match self {
            Family::V4 => base.to_string(),
            Family::V6 => format!("{base}6"),
        }
    }
    pub fn addr_type(self) -> NftType {
        match self {
            Family::V4 => NftType::Ipv4Addr,
            Family::V6 => NftType::Ipv6Addr,
        }
    }
    pub fn saddr(self) -> Selector {
        match self {
            Family::V4 => Selector::IpSaddr,
            Family::V6 => Selector::Ip6Saddr,
        }
    }
    pub fn daddr(self) -> Selector {
        match self {
            Family::V4 => Selector::IpDaddr,
            Family::V6 => Selector::Ip6Daddr,
        }
    }
    fn nat(self) -> NftFamily {
        match self {
            Family::V4 => NftFamily::Ip,
            Family::V6 => NftFamily::Ip6,
        }
    }
}

/// Whether a mapping's contributions go into a node's parts or come out of them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Edit {
    Add,
    Take,
}

/// Entries as the mappings give them, each with how many give it: a patch takes one mapping's
/// away and leaves what others give (docs/design.md, "Compute by change"). Mappings that give
/// one key give it one value: admission lets one mapping publish a port on an interface, and a
/// link's device names one end of it.
type Counted<K, V> = BTreeMap<K, (V, u32)>;

/// Port ranges, each with how many mappings give it; read in order, each once.
type Bag = Counted<Ports, ()>;

/// Adds or takes one mapping's `value` at `key`; the last added is the one rendered. False: a
/// take found nothing there.
fn count<K: Ord, V>(map: &mut Counted<K, V>, edit: Edit, key: K, value: V) -> bool {
    match (map.entry(key), edit) {
        (Entry::Vacant(e), Edit::Add) => {
            e.insert((value, 1));
        }
        (Entry::Occupied(mut e), Edit::Add) => {
            let (v, n) = e.get_mut();
            (*v, *n) = (value, *n + 1);
        }
        (Entry::Occupied(mut e), Edit::Take) => match e.get().1 {
            0 | 1 => {
                e.remove();
            }
            _ => e.get_mut().1 -= 1,
        },
        (Entry::Vacant(_), Edit::Take) => return false,
    }
    true
}

/// Adds or takes one mapping's `ports` in `key`'s bag; as [`count`].
fn bag<K: Ord>(map: &mut BTreeMap<K, Bag>, edit: Edit, key: K, ports: Ports) -> bool {
    match (map.entry(key), edit) {
        (Entry::Vacant(e), Edit::Add) => {
            e.insert(Bag::from([(ports, ((), 1))]));
            true
        }
        (Entry::Occupied(mut e), _) => {
            let found = count(e.get_mut(), edit, ports, ());
            if e.get().is_empty() {
                e.remove();
            }
            found
        }
        (Entry::Vacant(_), Edit::Take) => false,
    }
}

/// What one family of one node's table holds, collected mapping by mapping.
#[derive(Clone, Default)]
struct FamilyParts {
    publish_port: Counted<(String, L4Proto, u16), (IpAddr, u16)>,
    publish_range: Counted<(String, L4Proto, Ports), IpAddr>,
    /// Keyed by the link device and this end's address; rendered keyed by that address's
    /// stand-in, which the steering chain writes before the DNAT (steer.rs).
    link_port: Counted<(String, IpAddr, L4Proto, u16), (IpAddr, u16)>,
    link_range: Counted<(String, IpAddr, L4Proto, Ports), IpAddr>,
    claim: BTreeMap<(String, IpAddr, L4Proto), Bag>,
    reply_claim: BTreeMap<(IpAddr, L4Proto), Bag>,
    return_mark: BTreeMap<(IpAddr, L4Proto, u32), Bag>,
    /// What this node publishes in this family, for the steering chain (steer.rs).
    published: BTreeMap<(String, L4Proto), Bag>,
    /// The published mappings with an allow-list, to its prefixes of this family (steer.rs).
    guard: Counted<(String, L4Proto, Ports), Vec<ipnet::IpNet>>,
    /// The published mappings with per-source bounds, to them (steer.rs).
    limit: Counted<(String, L4Proto, Ports), super::admission::SourceLimit>,
}

/// What a mapping's accepting nodes enforce before the DNAT (docs/portmap/guard.md).
struct Guard {
    /// The allow-list's prefixes of this family; None: every client (no list).
    allow: Option<Vec<ipnet::IpNet>>,
    /// The per-source bounds; None: none.
    limit: Option<super::admission::SourceLimit>,
}

impl FamilyParts {
    /// Publishes `ports` on `iface` to `to`: the pod or the link's far end, with the port a single
    /// port is rewritten to (a range keeps its ports); behind `guard`'s allow-list and per-source
    /// bounds, if any.
    fn publish(
        &mut self,
        edit: Edit,
        iface: &str,
        proto: L4Proto,
        ports: Ports,
        guard: &Guard,
        to: (IpAddr, Option<u16>),
    ) -> bool {
        let mut found = bag(&mut self.published, edit, (iface.to_string(), proto), ports);
        if let Some(nets) = &guard.allow {
            found &= count(&mut self.guard, edit, (iface.to_string(), proto, ports), nets.clone());
        }
        if let Some(l) = guard.limit {
            found &= count(&mut self.limit, edit, (iface.to_string(), proto, ports), l);
        }
        found
            & match to {
                (address, Some(port)) => {
                    count(&mut self.publish_port, edit, (iface.to_string(), proto, ports.0), (address, port))
                }
                (address, None) => count(&mut self.publish_range, edit, (iface.to_string(), proto, ports), address),
            }
    }

    fn is_empty(&self) -> bool {
        self.publish_port.is_empty()
            && self.publish_range.is_empty()
            && self.link_port.is_empty()
            && self.link_range.is_empty()
            && self.claim.is_empty()
            && self.reply_claim.is_empty()
            && self.return_mark.is_empty()
    }
}

/// Everything one node holds, rendered once, and kept for the next compute: a patch takes the
/// mappings it reached out and puts them back as they are now, and renders from the rest.
#[derive(Clone, Default)]
pub struct NodeParts {
    v4: FamilyParts,
    v6: FamilyParts,
    /// Every link whose replies this node diverts, to its mark: a request arriving on it saves
    /// the mark in its connection, so only that connection's replies are marked (Single and Multi).
    ct_mark: Counted<String, u32>,
    /// How many Multi mappings a link here serves: the reply takes the saved mark as it is
    /// (Single's replies take theirs from the return mark maps, keyed by it).
    restore: u32,
    links: Counted<String, LinkEnd>,
    /// Links whose replies this node diverts (it holds the pod).
    diverted: Counted<String, ()>,
    /// Links that carry an IPv6 mapping: only they get IPv6 addresses, so a node with IPv6
    /// disabled keeps working links as long as it serves IPv4 only.
    carry_v6: Counted<String, ()>,
}

impl NodeParts {
    fn family(&mut self, fam: Family) -> &mut FamilyParts {
        match fam {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }
    fn of(&self, fam: Family) -> &FamilyParts {
        match fam {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }
}

/// What [`Builder::add`] reads of a placement: a patch takes away a mapping's as it was, even
/// one whose PortMap is gone.
pub struct Given<'p> {
    pub accepted: &'p super::admission::Accepted,
    /// Its class serves Multi.
    pub multi: bool,
    pub endpoint: &'p super::placement::Endpoint,
    pub nodes: &'p BTreeMap<String, Vec<String>>,
}

impl<'p> Given<'p> {
    pub fn of(p: &'p Placement) -> Self {
        let multi = matches!(p.admitted.class.spec.serving_mode, ServingMode::Multi);
        Given { accepted: &p.admitted, multi, endpoint: &p.endpoint, nodes: &p.nodes }
    }

    /// [`Placement::pod_ports`].
    fn pod_ports(&self) -> Ports {
        super::placement::pod_ports(self.accepted, self.endpoint)
    }
}

/// The nodes' states, built from every programmed mapping.
pub struct Builder {
    nodes: BTreeMap<String, NodeParts>,
    /// Only the nodes given are built: the others' parts are not written.
    only: bool,
    missed: bool,
}

impl Builder {
    pub fn new(all_nodes: impl IntoIterator<Item = String>) -> Self {
        Builder {
            nodes: all_nodes.into_iter().map(|n| (n, NodeParts::default())).collect(),
            only: false,
            missed: false,
        }
    }

    /// A builder of `nodes` alone: what a mapping gives any other node is left out.
    pub fn only(nodes: impl IntoIterator<Item = String>) -> Self {
        Builder { only: true, ..Builder::new(nodes) }
    }

    /// A builder of `nodes` alone, each from the parts a compute before kept of it (none: empty).
    pub fn resume(nodes: impl IntoIterator<Item = (String, Option<Arc<NodeParts>>)>) -> Self {
        let nodes = nodes.into_iter().map(|(n, kept)| (n, kept.map(Arc::unwrap_or_clone).unwrap_or_default()));
        Builder { nodes: nodes.collect(), only: true, missed: false }
    }

    fn parts(&mut self, node: &str) -> Option<&mut NodeParts> {
        if self.only {
            return self.nodes.get_mut(node);
        }
        Some(self.nodes.entry(node.to_string()).or_default())
    }

    /// A digest of everything [`Builder::add`] reads for one mapping: while it stays the same,
    /// so do the mapping's elements on every node, and a node that acknowledged them once
    /// need not acknowledge them again for the mapping to stay Programmed.
    ///
    /// The pod node's claim device is left out: it comes from that node's facts, which a new
    /// leader learns only after the node connects, and a status must not flap to Pending for it.
    pub fn fingerprint(p: &Placement, ends: &BTreeMap<String, (LinkEnd, LinkEnd)>) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (l4(p.admitted.protocol) as i32, p.admitted.ports, p.pod_ports()).hash(&mut h);
        (&p.endpoint.node, p.endpoint.address, p.endpoint.address6, p.endpoint.port, &p.nodes).hash(&mut h);
        matches!(p.admitted.class.spec.serving_mode, ServingMode::Multi).hash(&mut h);
        (&p.admitted.source_ranges, p.admitted.rate_limit).hash(&mut h);
        ends.hash(&mut h);
        h.finish()
    }

    /// The programming nodes that publish a mapping over IPv6 as well: all of them where the pod
    /// has an IPv6 address, less those whose link to the pod's node is too thin for IPv6
    /// ([`IPV6_MIN_MTU`]).
    pub fn over_v6(p: &Placement, ends: &BTreeMap<String, (LinkEnd, LinkEnd)>) -> BTreeSet<String> {
        if p.endpoint.address6.is_none() {
            return BTreeSet::new();
        }
        let carries = |node: &String| {
            *node == p.endpoint.node || ends.get(node).is_some_and(|(_, far)| far.addresses(Family::V6).is_some())
        };
        p.nodes.keys().filter(|n| carries(n)).cloned().collect()
    }

    /// Adds one mapping. `ends` holds, for each programming node that lacks the pod, its end and
    /// the pod node's end of their link. `pod_device` is the device the pod node's kernel routes
    /// the pod's address through (from its facts): the request claim's egress device there.
    /// None leaves that claim out (the route is not known, or the pod is the node's own address
    /// and its traffic leaves by no device); everything else is built.
    ///
    /// IPv6 is built where the pod has an IPv6 address and, across a link, where the link
    /// carries IPv6 ([`Builder::over_v6`]).
    pub fn add(&mut self, p: &Placement, ends: &BTreeMap<String, (LinkEnd, LinkEnd)>, pod_device: Option<&str>) {
        self.edit(Edit::Add, &Given::of(p), ends, pod_device);
    }

    /// Takes away what [`Builder::add`] gave for the same placement, ends and device, leaving
    /// what other mappings give.
    pub fn take(&mut self, p: &Given, ends: &BTreeMap<String, (LinkEnd, LinkEnd)>, pod_device: Option<&str>) {
        self.edit(Edit::Take, p, ends, pod_device);
    }

    fn edit(&mut self, edit: Edit, p: &Given, ends: &BTreeMap<String, (LinkEnd, LinkEnd)>, dev: Option<&str>) {
        let pods =
            [(Family::V4, Some(IpAddr::V4(p.endpoint.address))), (Family::V6, p.endpoint.address6.map(IpAddr::V6))];
        for (fam, pod) in pods {
            let Some(pod) = pod else { continue };
            self.edit_family(edit, fam, p, pod, ends, dev);
        }
    }

    fn edit_family(
        &mut self,
        edit: Edit,
        fam: Family,
        p: &Given,
        pod: IpAddr,
        ends: &BTreeMap<String, (LinkEnd, LinkEnd)>,
        pod_device: Option<&str>,
    ) {
        let mut found = true;
        let proto = l4(p.accepted.protocol);
        let ports = p.accepted.ports;
        let pod_ports = p.pod_ports();
        let single = !p.accepted.is_range();
        // This family's prefixes of the allow-list, if the mapping has one: empty closes the
        // family to every client.
        let nets = p.accepted.source_ranges.as_ref();
        let guard = Guard {
            allow: nets.map(|nets| nets.iter().filter(|n| fam.holds(&n.addr())).copied().collect()),
            limit: p.accepted.rate_limit,
        };
        for (node, ifaces) in p.nodes {
            if *node == p.endpoint.node {
                let Some(parts) = self.parts(node) else { continue };
                let parts = parts.family(fam);
                for iface in ifaces {
                    found &= parts.publish(edit, iface, proto, ports, &guard, (pod, single.then_some(p.endpoint.port)));
                }
                if let Some(dev) = pod_device {
                    found &= bag(&mut parts.claim, edit, (dev.to_string(), pod, proto), pod_ports);
                }
                continue;
            }
            let Some((near, far)) = ends.get(node) else { continue };
            let Some((far_address, _)) = far.addresses(fam) else { continue };
            // The accepting end: translate to the far end of the link, keep the port.
            if let Some(node_parts) = self.parts(node) {
                found &= count(&mut node_parts.links, edit, near.device.clone(), near.clone());
                if fam == Family::V6 {
                    found &= count(&mut node_parts.carry_v6, edit, near.device.clone(), ());
                }
                let parts = node_parts.family(fam);
                for iface in ifaces {
                    found &= parts.publish(edit, iface, proto, ports, &guard, (far_address, single.then_some(ports.0)));
                }
                found &= bag(&mut parts.claim, edit, (near.device.clone(), far_address, proto), ports);
            }
            // The pod's end: finish the translation, claim both directions, return the reply.
            let Some(node_parts) = self.parts(&p.endpoint.node) else { continue };
            found &= count(&mut node_parts.links, edit, far.device.clone(), far.clone());
            found &= count(&mut node_parts.diverted, edit, far.device.clone(), ());
            if fam == Family::V6 {
                found &= count(&mut node_parts.carry_v6, edit, far.device.clone(), ());
            }
            found &= count(&mut node_parts.ct_mark, edit, far.device.clone(), far.numbers.mark());
            if p.multi {
                node_parts.restore = match edit {
                    Edit::Add => node_parts.restore + 1,
                    Edit::Take => {
                        found &= node_parts.restore > 0;
                        node_parts.restore.saturating_sub(1)
                    }
                };
            }
            let parts = node_parts.family(fam);
            if single {
                let key = (far.device.clone(), far_address, proto, ports.0);
                found &= count(&mut parts.link_port, edit, key, (pod, p.endpoint.port));
            } else {
                found &= count(&mut parts.link_range, edit, (far.device.clone(), far_address, proto, ports), pod);
            }
            if let Some(dev) = pod_device {
                found &= bag(&mut parts.claim, edit, (dev.to_string(), pod, proto), pod_ports);
            }
            found &= bag(&mut parts.reply_claim, edit, (pod, proto), pod_ports);
            if !p.multi {
                found &= bag(&mut parts.return_mark, edit, (pod, proto, far.numbers.mark()), pod_ports);
            }
        }
        self.missed |= !found;
    }

    /// Whether a take found something missing: the parts it resumed from were not made from
    /// what it took.
    pub fn missed(&self) -> bool {
        self.missed
    }

    /// Every node's host namespace as the port maps need it (empty for a node without any),
    /// with the parts it was rendered from. `view` gives each node's published addresses, for
    /// the steering chain.
    pub fn finish(self, view: &View) -> BTreeMap<String, (NetnsState, Arc<NodeParts>)> {
        self.nodes
            .into_iter()
            .map(|(node, parts)| {
                let v = view.node(&node);
                // Past a host firewall (docs/portmap/firewall.md): requests to the accepting
                // interfaces' addresses, and on the pod's node those to this end of a link.
                let mut to_node = super::steer::Destinations::new();
                let (mut guards, mut limits) = (super::steer::Guards::new(), super::steer::Limits::new());
                for fam in Family::BOTH {
                    let f = parts.of(fam);
                    let published: super::steer::Published =
                        f.published.iter().map(|(k, b)| (k.clone(), b.keys().copied().collect())).collect();
                    to_node.extend(super::steer::accepting(&published, fam, |i| v.addresses_of(i)));
                    let guard = f.guard.iter().map(|(k, (nets, _))| (k, nets));
                    guards.extend(super::steer::per_address(guard, fam, |i| v.addresses_of(i)));
                    let limit = f.limit.iter().map(|(k, (l, _))| (k, l));
                    limits.extend(super::steer::per_address(limit, fam, |i| v.addresses_of(i)));
                    for (dev, me, pr, port) in f.link_port.keys() {
                        to_node.entry((dev.clone(), *me, *pr)).or_default().push((*port, *port));
                    }
                    for (dev, me, pr, ports) in f.link_range.keys() {
                        to_node.entry((dev.clone(), *me, *pr)).or_default().push(*ports);
                    }
                }
                let steer = super::steer::steering(&to_node, &guards, &limits);
                let stand_in = steer.as_ref().map(|s| s.stand_in.clone()).unwrap_or_default();
                // Each accepting interface's addresses: the publish maps are keyed by their
                // stand-ins, so that only what is addressed to the node is delivered.
                let mut ifaces = BTreeMap::new();
                for fam in Family::BOTH {
                    for (iface, _) in parts.of(fam).published.keys() {
                        ifaces.entry(iface.clone()).or_insert_with(|| super::steer::addresses(v.addresses_of(iface)));
                    }
                }
                let mut ns = render(&parts, &stand_in, &ifaces);
                if let (Some(t), Some(s)) = (ns.nft_tables.first_mut(), steer) {
                    t.sets.extend(s.sets);
                    t.chains.push(s.chain);
                    t.chains.extend(s.mapping_chains);
                }
                (node, (ns, Arc::new(parts)))
            })
            .collect()
    }
}

/// `stand_in`: the steering chain's stand-in of each address it rewrites (steer.rs); `ifaces`:
/// each accepting interface's addresses.
fn render(parts: &NodeParts, stand_in: &BTreeMap<IpAddr, IpAddr>, ifaces: &Addresses) -> NetnsState {
    let mut ns = NetnsState::default();
    if let Some(table) = table(parts, stand_in, ifaces) {
        ns.sysctls.push(Sysctl { key: FORWARDING.into(), value: "1".into() });
        if !parts.v6.is_empty() {
            ns.sysctls.push(Sysctl { key: FORWARDING6.into(), value: "1".into() });
        }
        ns.nft_tables.push(table);
    }
    for (end, _) in parts.links.values() {
        ns.links.push(Link {
            name: end.device.clone(),
            mtu: end.mtu,
            kind: Some(link::Kind::Vxlan(Vxlan {
                vni: end.numbers.vni,
                local: end.local_underlay.to_string(),
                remote: end.peer_underlay.to_string(),
                dstport: u32::from(end.numbers.port),
                ttl: VXLAN_TTL,
            })),
            mac: end.mac.clone(),
        });
        for fam in Family::BOTH {
            let Some((me, peer)) = end.addresses(fam) else { continue };
            if fam == Family::V6 && !parts.carry_v6.contains_key(&end.device) {
                continue;
            }
            let len = if fam == Family::V4 { 31 } else { 127 };
            ns.addresses.push(Address { dev: end.device.clone(), cidr: format!("{me}/{len}") });
            // The far end resolved for good: no ARP (or neighbour discovery) between a rebuilt
            // link and traffic.
            ns.neighbours.push(Neighbour {
                dev: end.device.clone(),
                address: peer.to_string(),
                mac: end.peer_mac.clone(),
            });
            if !parts.diverted.contains_key(&end.device) {
                continue;
            }
            let mark = end.numbers.mark();
            ns.routes.push(Route {
                table: end.numbers.table(),
                dst: "default".into(),
                via: peer.to_string(),
                dev: end.device.clone(),
            });
            // The underlay is IPv4: only its family needs the guard that keeps the link's own
            // outer packets out of the link.
            if fam == Family::V4 {
                ns.ip_rules.push(IpRule {
                    pref: Rule::LoopGuard.preference(),
                    fwmark: mark,
                    fwmask: u32::MAX,
                    to: format!("{}/32", end.peer_underlay),
                    table: MAIN_TABLE,
                    ipv6: false,
                });
            }
            ns.ip_rules.push(IpRule {
                pref: Rule::Divert.preference(),
                fwmark: mark,
                fwmask: u32::MAX,
                to: String::new(),
                table: end.numbers.table(),
                ipv6: fam == Family::V6,
            });
        }
    }
    ns
}

/// No setting shapes the table: the CNI's devices come from the facts (`pod_device` in
/// [`Builder::add`]) and the rules name only kuport's own (docs/portmap/datapath.md).
///
/// The link maps are keyed by the stand-in of this end's address: the steering chain has
/// rewritten the destination to it before the DNAT runs. An address without a stand-in (past
/// the 254th, steer.rs) is not steered and keys its elements itself.
fn table(p: &NodeParts, stand_in: &BTreeMap<IpAddr, IpAddr>, ifaces: &Addresses) -> Option<NftTable> {
    let mut sets = Vec::new();
    let (mut pre, mut post, mut mangle) = (Vec::new(), Vec::new(), Vec::new());
    for fam in Family::BOTH {
        family_rules(fam, p.of(fam), stand_in, ifaces, &mut sets, [&mut pre, &mut post, &mut mangle]);
    }
    use Selector::{CtDirection, CtMark, Iifname, IpSaddr, UdpDport};
    if !p.links.is_empty() {
        // A new connection out of a link that no link map translated: kuport sent no such thing
        // into the link (its replies belong to known connections, which skip the nat chains).
        // The links by name: the mesh's `kup-wg` shares their prefix.
        let elements = p.links.keys().map(|dev| el(vec![ifname(dev)], vec![])).collect();
        sets.push(NftSet { counter: false, ..set(SET_LINK_DEVICES, &[NftType::Ifname], &[], false, elements) });
        let from_link = lookup(&[Iifname], SET_LINK_DEVICES);
        pre.push(rule(vec![from_link], vec![counter(), verdict(VerdictKind::Drop)]));
    }
    if !p.ct_mark.is_empty() {
        let elements = p.ct_mark.iter().map(|(dev, (m, _))| el(vec![ifname(dev)], vec![mark(*m)])).collect();
        let mut s = set(MAP_CT_MARK, &[NftType::Ifname], &[NftType::Mark], false, elements);
        s.counter = false;
        sets.push(s);
        // The request a link brings in; never a reply arriving on it.
        let original = compare(CtDirection, CmpOp::Eq, value(nft_value::Value::Id(CT_DIRECTION_ORIGINAL)), 0);
        let save = SetMark { from: Some(set_mark::From::Map(map_lookup(&[Iifname], MAP_CT_MARK))) };
        mangle.push(rule(vec![original], vec![stmt(nft_statement::Kind::CtMarkSet(save))]));
    }
    if p.restore > 0 {
        let restore = SetMark { from: Some(set_mark::From::Selector(CtMark as i32)) };
        // The replies of connections a link brought in: never the request itself, which is in
        // the original direction, whatever device either arrives on.
        let reply = compare(CtDirection, CmpOp::Eq, value(nft_value::Value::Id(CT_DIRECTION_REPLY)), 0);
        let ours = compare(CtMark, CmpOp::Eq, mark(MARK_PREFIX), MARK_PREFIX_MASK);
        mangle.push(rule(vec![reply, ours], vec![stmt(nft_statement::Kind::MetaMarkSet(restore))]));
    }
    // Each link's VXLAN port takes packets from its peer only (docs/portmap/datapath.md, "kup-links").
    let mut links = Vec::new();
    if !p.links.is_empty() {
        let peers: BTreeSet<(Ipv4Addr, u16)> =
            p.links.values().map(|(e, _)| (e.peer_underlay, e.numbers.port)).collect();
        let ports: BTreeSet<u16> = peers.iter().map(|(_, port)| *port).collect();
        let elements = ports.iter().map(|x| el(vec![port_v(*x, *x)], vec![])).collect();
        sets.push(NftSet { counter: false, ..set(SET_LINK_PORTS, &[NftType::InetService], &[], false, elements) });
        let elements = peers.iter().map(|(a, x)| el(vec![addr(IpAddr::V4(*a)), port_v(*x, *x)], vec![])).collect();
        let key = [NftType::Ipv4Addr, NftType::InetService];
        sets.push(NftSet { counter: false, ..set(SET_LINK_PEERS, &key, &[], false, elements) });
        let to_link = lookup(&[UdpDport], SET_LINK_PORTS);
        let not_peer = NftMatch {
            kind: Some(nft_match::Kind::Lookup(SetLookup {
                key: keys(&[IpSaddr, UdpDport]),
                set: SET_LINK_PEERS.into(),
                negate: true,
            })),
        };
        links.push(rule(vec![to_link, not_peer], vec![counter(), verdict(VerdictKind::Drop)]));
    }
    if pre.is_empty() && post.is_empty() && mangle.is_empty() {
        return None;
    }
    let mut chains = Vec::new();
    for (name, type_, prio, rules) in [
        (CHAIN_PRE, ChainType::Nat, PRE_PRIORITY, pre),
        (CHAIN_POST, ChainType::Nat, POST_PRIORITY, post),
        (CHAIN_MANGLE, ChainType::Filter, MANGLE_PRIORITY, mangle),
        (CHAIN_LINKS, ChainType::Filter, LINKS_PRIORITY, links),
    ] {
        if rules.is_empty() {
            continue;
        }
        let hook = match name {
            CHAIN_POST => Hook::Postrouting,
            CHAIN_LINKS => Hook::Input,
            _ => Hook::Prerouting,
        };
        chains.push(NftChain {
            name: name.into(),
            base: Some(BaseChain { r#type: type_ as i32, hook: hook as i32, priority: prio, policy: 0 }),
            rules,
        });
    }
    Some(NftTable { family: NftFamily::Inet as i32, name: TABLE.into(), sets: sets.into(), chains: chains.into() })
}

/// One family's maps and sets, and the rules that read them, into kup-pre, kup-post and
/// kup-mangle (in that order in `chains`).
fn family_rules(
    fam: Family,
    p: &FamilyParts,
    stand_in: &BTreeMap<IpAddr, IpAddr>,
    ifaces: &Addresses,
    sets: &mut Vec<NftSet>,
    chains: [&mut Vec<NftRule>; 3],
) {
    let [pre, post, mangle] = chains;
    let steered = |a: &IpAddr| *stand_in.get(a).unwrap_or(a);
    // An accepting interface's addresses of this family, as the steering chain rewrote them.
    let dsts = |i: &str| -> Vec<IpAddr> {
        ifaces.get(i).into_iter().flatten().filter(|a| fam.holds(a)).map(steered).collect()
    };
    let n = |base: &str| fam.name(base);
    let (addr_t, saddr, daddr) = (fam.addr_type(), fam.saddr(), fam.daddr());
    use NftType::{Ifname, InetProto, InetService, Mark};
    use Selector::{CtDirection, CtMark, Iifname, L4proto, Oifname, ThDport, ThSport};

    // Keyed by the destination too (its stand-in): a packet routed through the node to another
    // address on a published port is not the node's to deliver.
    let elements: Vec<NftElement> = p
        .publish_port
        .iter()
        .flat_map(|((i, pr, port), ((a, to), _))| {
            dsts(i).into_iter().map(move |d| {
                el(vec![ifname(i), addr(d), proto(*pr), port_v(*port, *port)], vec![addr(*a), port_v(*to, *to)])
            })
        })
        .collect();
    if !elements.is_empty() {
        let name = n(MAP_PUBLISH_PORT);
        let key = [Ifname, addr_t, InetProto, InetService];
        sets.push(dnat_target_map(set(&name, &key, &[addr_t, InetService], false, elements)));
        pre.push(dnat_map(fam, &[Iifname, daddr, L4proto, ThDport], &name));
    }
    let elements: Vec<NftElement> = p
        .publish_range
        .iter()
        .flat_map(|((i, pr, (a, b)), (to, _))| {
            dsts(i).into_iter().map(move |d| el(vec![port_v(*a, *b), ifname(i), addr(d), proto(*pr)], vec![addr(*to)]))
        })
        .collect();
    if !elements.is_empty() {
        let name = n(MAP_PUBLISH_RANGE);
        sets.push(dnat_target_map(set(&name, &[InetService, Ifname, addr_t, InetProto], &[addr_t], true, elements)));
        pre.push(dnat_map(fam, &[ThDport, Iifname, daddr, L4proto], &name));
    }
    if !p.link_port.is_empty() {
        let elements = p
            .link_port
            .iter()
            .map(|((i, me, pr, port), ((a, to), _))| {
                let key = vec![ifname(i), addr(steered(me)), proto(*pr), port_v(*port, *port)];
                el(key, vec![addr(*a), port_v(*to, *to)])
            })
            .collect();
        let name = n(MAP_LINK_PORT);
        let key = [Ifname, addr_t, InetProto, InetService];
        sets.push(dnat_target_map(set(&name, &key, &[addr_t, InetService], false, elements)));
        pre.push(dnat_map(fam, &[Iifname, daddr, L4proto, ThDport], &name));
    }
    if !p.link_range.is_empty() {
        let elements = p
            .link_range
            .iter()
            .map(|((i, me, pr, (a, b)), (to, _))| {
                el(vec![port_v(*a, *b), ifname(i), addr(steered(me)), proto(*pr)], vec![addr(*to)])
            })
            .collect();
        let name = n(MAP_LINK_RANGE);
        sets.push(dnat_target_map(set(&name, &[InetService, Ifname, addr_t, InetProto], &[addr_t], true, elements)));
        pre.push(dnat_map(fam, &[ThDport, Iifname, daddr, L4proto], &name));
    }
    let (port, range) = split(&p.claim, |(o, a, pr)| (vec![ifname(o), addr(*a), proto(*pr)], vec![]));
    if !port.is_empty() {
        let name = n(SET_CLAIM_PORT);
        sets.push(claim_set(set(&name, &[Ifname, addr_t, InetProto, InetService], &[], false, port)));
        post.push(rule(vec![lookup(&[Oifname, daddr, L4proto, ThDport], &name)], vec![identity_snat(fam)]));
    }
    if !range.is_empty() {
        let name = n(SET_CLAIM_RANGE);
        sets.push(claim_set(set(&name, &[InetService, Ifname, addr_t, InetProto], &[], true, range)));
        post.push(rule(vec![lookup(&[ThDport, Oifname, daddr, L4proto], &name)], vec![identity_snat(fam)]));
    }
    let (port, range) = split(&p.reply_claim, |(a, pr)| (vec![addr(*a), proto(*pr)], vec![]));
    // Only a reply that leaves into one of kuport's links: there the CNI's egress masquerade
    // would rewrite it, and kuport alone decides which replies go that way.
    let into_link = || compare(Oifname, CmpOp::Eq, ifname(&format!("{}*", kuport_proto::owned::LINK_PREFIX)), 0);
    if !port.is_empty() {
        let name = n(SET_REPLY_CLAIM_PORT);
        sets.push(set(&name, &[addr_t, InetProto, InetService], &[], false, port));
        let claim = lookup(&[saddr, L4proto, ThSport], &name);
        post.push(rule(vec![into_link(), claim], vec![identity_snat(fam)]));
    }
    if !range.is_empty() {
        let name = n(SET_REPLY_CLAIM_RANGE);
        sets.push(set(&name, &[InetService, addr_t, InetProto], &[], true, range));
        let claim = lookup(&[ThSport, saddr, L4proto], &name);
        post.push(rule(vec![into_link(), claim], vec![identity_snat(fam)]));
    }
    // Keyed by the ct mark the link's request saved (kup-mangle's save): only the replies of
    // connections that link brought in to the pod are marked, never the pod's other traffic.
    let (port, range) = split(&p.return_mark, |(a, pr, m)| (vec![mark(*m), addr(*a), proto(*pr)], vec![mark(*m)]));
    let mark_from = |k: &[Selector], map: &str| {
        let from = SetMark { from: Some(set_mark::From::Map(map_lookup(k, map))) };
        let reply = compare(CtDirection, CmpOp::Eq, value(nft_value::Value::Id(CT_DIRECTION_REPLY)), 0);
        rule(vec![reply], vec![stmt(nft_statement::Kind::MetaMarkSet(from))])
    };
    if !port.is_empty() {
        let name = n(MAP_RETURN_MARK_PORT);
        sets.push(set(&name, &[Mark, addr_t, InetProto, InetService], &[Mark], false, port));
        mangle.push(mark_from(&[CtMark, saddr, L4proto, ThSport], &name));
    }
    if !range.is_empty() {
        let name = n(MAP_RETURN_MARK_RANGE);
        sets.push(set(&name, &[InetService, Mark, addr_t, InetProto], &[Mark], true, range));
        mangle.push(mark_from(&[ThSport, CtMark, saddr, L4proto], &name));
    }
}

/// Merges each group's port ranges, then splits the merged intervals: single ports keyed in the
/// natural order (the group's fields, then the port) for a hash set, ranges keyed ports first for
/// an interval set. `fields` gives a group's key fields and data.
fn split<K>(
    groups: &BTreeMap<K, Bag>,
    fields: impl Fn(&K) -> (Vec<NftValue>, Vec<NftValue>),
) -> (Vec<NftElement>, Vec<NftElement>) {
    let (mut port, mut range) = (Vec::new(), Vec::new());
    for (group, ranges) in groups {
        let (key, data) = fields(group);
        for (a, b) in merge(&ranges.keys().copied().collect::<Vec<_>>()) {
            if a == b {
                let mut k = key.clone();
                k.push(port_v(a, b));
                port.push(el(k, data.clone()));
            } else {
                let k = std::iter::once(port_v(a, b)).chain(key.iter().cloned()).collect();
                range.push(el(k, data.clone()));
            }
        }
    }
    (port, range)
}

/// Merges overlapping port ranges: interval sets refuse overlaps.
pub(super) fn merge(ranges: &[Ports]) -> Vec<Ports> {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<Ports> = Vec::new();
    for (a, b) in sorted {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

fn set(name: &str, key: &[NftType], data: &[NftType], interval: bool, elements: Vec<NftElement>) -> NftSet {
    NftSet {
        name: name.into(),
        key: key.iter().map(|t| *t as i32).collect(),
        data: data.iter().map(|t| *t as i32).collect(),
        interval,
        counter: true,
        elements: elements.into(),
        ..Default::default()
    }
}

/// A DNAT map: when an element's target changes, the executor deletes the UDP flows still on
/// the old path (docs/portmap/datapath.md, "UDP flows when a target moves").
fn dnat_target_map(set: NftSet) -> NftSet {
    NftSet { udp_flows: UdpFlows::Dnat as i32, ..set }
}

/// A request claim: when an element comes, the executor deletes the UDP flows to the pod that
/// the CNI's masquerade rewrote before it (the pod's route reported after its mapping was
/// placed), so they keep no wrong client address (docs/portmap/datapath.md, "UDP flows when a
/// target moves").
fn claim_set(set: NftSet) -> NftSet {
    NftSet { udp_flows: UdpFlows::Claim as i32, ..set }
}

fn el(key: Vec<NftValue>, data: Vec<NftValue>) -> NftElement {
    NftElement { key, data }
}

fn value(v: nft_value::Value) -> NftValue {
    NftValue { value: Some(v) }
}
fn ifname(s: &str) -> NftValue {
    value(nft_value::Value::Ifname(s.to_string()))
}
fn addr(a: IpAddr) -> NftValue {
    value(nft_value::Value::Addr(a.to_string()))
}
fn proto(p: L4Proto) -> NftValue {
    value(nft_value::Value::Proto(p as i32))
}
fn port_v(first: u16, last: u16) -> NftValue {
    value(nft_value::Value::Port(PortRange { first: first.into(), last: last.into() }))
}
fn mark(m: u32) -> NftValue {
    value(nft_value::Value::Mark(m))
}

fn counter() -> NftStatement {
    stmt(nft_statement::Kind::Counter(Counter {}))
}
fn verdict(kind: VerdictKind) -> NftStatement {
    stmt(nft_statement::Kind::Verdict(Verdict { kind: kind as i32, chain: String::new() }))
}
fn rule(matches: Vec<NftMatch>, statements: Vec<NftStatement>) -> NftRule {
    NftRule { matches, statements }
}
fn stmt(kind: nft_statement::Kind) -> NftStatement {
    NftStatement { kind: Some(kind) }
}
fn keys(k: &[Selector]) -> Vec<i32> {
    k.iter().map(|s| *s as i32).collect()
}
fn map_lookup(k: &[Selector], map: &str) -> MapLookup {
    MapLookup { key: keys(k), map: map.into() }
}
fn lookup(k: &[Selector], set: &str) -> NftMatch {
    NftMatch { kind: Some(nft_match::Kind::Lookup(SetLookup { key: keys(k), set: set.into(), negate: false })) }
}
fn compare(sel: Selector, op: CmpOp, v: NftValue, mask: u32) -> NftMatch {
    NftMatch {
        kind: Some(nft_match::Kind::Compare(Compare { selector: sel as i32, op: op as i32, value: Some(v), mask })),
    }
}
fn dnat_map(fam: Family, k: &[Selector], map: &str) -> NftRule {
    let nat = Nat {
        kind: NatKind::Dnat as i32,
        family: fam.nat() as i32,
        to: Some(kuport_proto::v1::nat::To::Map(map_lookup(k, map))),
    };
    rule(vec![], vec![stmt(nft_statement::Kind::Nat(nat))])
}
/// `snat ip to ip saddr` (or ip6): changes nothing, but claims the connection's source NAT for
/// this hook, so the CNI's masquerade, which sorts later, never rewrites the client's address.
fn identity_snat(fam: Family) -> NftStatement {
    let nat = Nat {
        kind: NatKind::Snat as i32,
        family: fam.nat() as i32,
        to: Some(kuport_proto::v1::nat::To::Selector(fam.saddr() as i32)),
    };
    stmt(nft_statement::Kind::Nat(nat))
}
