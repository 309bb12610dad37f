//! The rule shapes: where every nftables element, link, route and ip rule of a port map is
//! decided; docs/portmap/datapath.md explains each, with its measurement and its test.
//!
//! One table, `ip kuport`, with three chains at the priorities below. Mappings are elements of
//! maps and sets keyed by concatenations, never rules of their own, so a new connection costs
//! the same at 10 mappings as at 50,000 (one rule per mapping was measured 36 times slower).
//!
//! | chain      | hook, priority       | rule                                                      |
//! |------------|----------------------|-----------------------------------------------------------|
//! | kup-pre    | nat prerouting -110  | DNAT published ports to the pod or to the link's far end  |
//! |            |                      | DNAT link arrivals (this end's stand-in, steer.rs) to the pod |
//! | kup-post   | nat postrouting 90   | identity SNAT claiming the request before the CNI's masquerade |
//! |            |                      | identity SNAT claiming the pod's reply into a kup- link   |
//! | kup-mangle | filter prerouting -140 | Single: mark replies by pod address, protocol and port  |
//! |            |                      | Multi: save the arrival link in ct mark, restore on ct reply |
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

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use kuport_proto::v1::{
    Address, BaseChain, ChainType, CmpOp, Compare, Hook, IpRule, L4Proto, Link, MapLookup, Nat, NatKind, Neighbour,
    NetnsState, NftChain, NftElement, NftFamily, NftMatch, NftRule, NftSet, NftStatement, NftTable, NftType, NftValue,
    PortRange, Route, Selector, SetLookup, SetMark, Sysctl, Vxlan, link, nft_match, nft_statement, nft_value, set_mark,
};

use super::links::{LinkKey, LinkNumbers, VXLAN_OVERHEAD, VXLAN_TTL, device_name, link_mac, mac_text};
use super::placement::{Placement, l4};
use crate::api::ServingMode;
use crate::compute::Settings;
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

const FORWARDING: &str = "net.ipv4.ip_forward";
/// `ct direction reply` (IP_CT_DIR_REPLY).
const CT_DIRECTION_REPLY: u32 = 1;

/// One end of a link, as one node sees it.
#[derive(Clone, Debug, Hash)]
pub struct LinkEnd {
    pub device: String,
    pub numbers: LinkNumbers,
    pub local_underlay: Ipv4Addr,
    pub peer_underlay: Ipv4Addr,
    pub address: Ipv4Addr,
    pub peer_address: Ipv4Addr,
    pub mtu: u32,
    /// This end's device MAC and the far end's, both computed from names ([`link_mac`]).
    pub mac: String,
    pub peer_mac: String,
}

impl LinkEnd {
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
        Some(LinkEnd {
            device: device_name(&key.class, peer),
            numbers: numbers.clone(),
            local_underlay,
            peer_underlay,
            address: numbers.address_of(key, node),
            peer_address: numbers.address_of(key, peer),
            mtu: outer_mtu.saturating_sub(VXLAN_OVERHEAD),
            mac: mac_text(link_mac(&key.class, node, peer)),
            peer_mac: mac_text(link_mac(&key.class, peer, node)),
        })
    }
}

type Ports = (u16, u16);

/// Everything one node holds, collected mapping by mapping, rendered once.
#[derive(Default)]
struct NodeParts {
    publish_port: BTreeMap<(String, L4Proto, u16), (Ipv4Addr, u16)>,
    publish_range: BTreeMap<(String, L4Proto, Ports), Ipv4Addr>,
    /// Keyed by the link device and this end's address; rendered keyed by that address's
    /// stand-in, which the steering chain writes before the DNAT (steer.rs).
    link_port: BTreeMap<(String, Ipv4Addr, L4Proto, u16), (Ipv4Addr, u16)>,
    link_range: BTreeMap<(String, Ipv4Addr, L4Proto, Ports), Ipv4Addr>,
    claim: BTreeMap<(String, Ipv4Addr, L4Proto), Vec<Ports>>,
    reply_claim: BTreeMap<(Ipv4Addr, L4Proto), Vec<Ports>>,
    return_mark: BTreeMap<(Ipv4Addr, L4Proto, u32), Vec<Ports>>,
    ct_mark: BTreeMap<String, u32>,
    links: BTreeMap<String, LinkEnd>,
    /// Links whose replies this node diverts (it holds the pod).
    diverted: BTreeSet<String>,
    /// What this node publishes, for the steering chain (steer.rs).
    published: super::steer::Published,
}

/// The nodes' states, built from every programmed mapping.
pub struct Builder<'s> {
    settings: &'s Settings,
    nodes: BTreeMap<String, NodeParts>,
}

impl<'s> Builder<'s> {
    pub fn new(settings: &'s Settings, all_nodes: impl IntoIterator<Item = String>) -> Self {
        Builder { settings, nodes: all_nodes.into_iter().map(|n| (n, NodeParts::default())).collect() }
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
        (&p.endpoint.node, p.endpoint.address, p.endpoint.port, &p.nodes).hash(&mut h);
        matches!(p.admitted.class.spec.serving_mode, ServingMode::Multi).hash(&mut h);
        ends.hash(&mut h);
        h.finish()
    }

    /// Adds one mapping. `ends` holds, for each programming node that lacks the pod, its end and
    /// the pod node's end of their link. `pod_device` is the device the pod node's kernel routes
    /// the pod's address through (from its facts): the request claim's egress device there.
    /// None leaves that claim out (the route is not known, or the pod is the node's own address
    /// and its traffic leaves by no device); everything else is built.
    pub fn add(&mut self, p: &Placement, ends: &BTreeMap<String, (LinkEnd, LinkEnd)>, pod_device: Option<&str>) {
        let proto = l4(p.admitted.protocol);
        let ports = p.admitted.ports;
        let pod = p.endpoint.address;
        let pod_ports = p.pod_ports();
        let single = !p.admitted.is_range();
        for (node, ifaces) in &p.nodes {
            if *node == p.endpoint.node {
                let parts = self.nodes.entry(node.clone()).or_default();
                for iface in ifaces {
                    parts.published.entry((iface.clone(), proto)).or_default().push(ports);
                    if single {
                        parts.publish_port.insert((iface.clone(), proto, ports.0), (pod, p.endpoint.port));
                    } else {
                        parts.publish_range.insert((iface.clone(), proto, ports), pod);
                    }
                }
                if let Some(dev) = pod_device {
                    parts.claim.entry((dev.to_string(), pod, proto)).or_default().push(pod_ports);
                }
                continue;
            }
            let Some((near, far)) = ends.get(node) else { continue };
            // The accepting end: translate to the far end of the link, keep the port.
            let parts = self.nodes.entry(node.clone()).or_default();
            for iface in ifaces {
                parts.published.entry((iface.clone(), proto)).or_default().push(ports);
                if single {
                    parts.publish_port.insert((iface.clone(), proto, ports.0), (far.address, ports.0));
                } else {
                    parts.publish_range.insert((iface.clone(), proto, ports), far.address);
                }
            }
            parts.claim.entry((near.device.clone(), far.address, proto)).or_default().push(ports);
            parts.links.insert(near.device.clone(), near.clone());
            // The pod's end: finish the translation, claim both directions, return the reply.
            let parts = self.nodes.entry(p.endpoint.node.clone()).or_default();
            if single {
                parts.link_port.insert((far.device.clone(), far.address, proto, ports.0), (pod, p.endpoint.port));
            } else {
                parts.link_range.insert((far.device.clone(), far.address, proto, ports), pod);
            }
            if let Some(dev) = pod_device {
                parts.claim.entry((dev.to_string(), pod, proto)).or_default().push(pod_ports);
            }
            parts.reply_claim.entry((pod, proto)).or_default().push(pod_ports);
            match p.admitted.class.spec.serving_mode {
                ServingMode::Single => {
                    parts.return_mark.entry((pod, proto, far.numbers.mark())).or_default().push(pod_ports);
                }
                ServingMode::Multi => {
                    parts.ct_mark.insert(far.device.clone(), far.numbers.mark());
                }
            }
            parts.links.insert(far.device.clone(), far.clone());
            parts.diverted.insert(far.device.clone());
        }
    }

    /// Every node's host namespace as the port maps need it (empty for a node without any).
    /// `view` gives each node's published addresses, for the steering chain.
    pub fn finish(self, view: &View) -> BTreeMap<String, NetnsState> {
        let settings = self.settings;
        self.nodes
            .into_iter()
            .map(|(node, parts)| {
                let v = view.node(&node);
                // Past a host firewall (docs/portmap/firewall.md): requests to the accepting
                // interfaces' addresses, and on the pod's node those to this end of a link.
                let mut to_node = super::steer::accepting(&parts.published, |i| v.addresses_of(i));
                for (dev, me, pr, port) in parts.link_port.keys() {
                    to_node.entry((dev.clone(), *me, *pr)).or_default().push((*port, *port));
                }
                for (dev, me, pr, ports) in parts.link_range.keys() {
                    to_node.entry((dev.clone(), *me, *pr)).or_default().push(*ports);
                }
                let steer = super::steer::steering(&to_node);
                let stand_in = steer.as_ref().map(|s| s.stand_in.clone()).unwrap_or_default();
                let mut ns = render(settings, parts, &stand_in);
                if let (Some(t), Some(s)) = (ns.nft_tables.first_mut(), steer) {
                    t.sets.extend(s.sets);
                    t.chains.push(s.chain);
                }
                (node, ns)
            })
            .collect()
    }
}

/// `stand_in`: the steering chain's stand-in of each address it rewrites (steer.rs).
fn render(settings: &Settings, parts: NodeParts, stand_in: &BTreeMap<Ipv4Addr, Ipv4Addr>) -> NetnsState {
    let mut ns = NetnsState::default();
    let table = table(settings, &parts, stand_in);
    if let Some(table) = table {
        ns.sysctls.push(Sysctl { key: FORWARDING.into(), value: "1".into() });
        ns.nft_tables.push(table);
    }
    for end in parts.links.values() {
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
        ns.addresses.push(Address { dev: end.device.clone(), cidr: format!("{}/31", end.address) });
        // The far end resolved for good: no ARP between a rebuilt link and traffic.
        ns.neighbours.push(Neighbour {
            dev: end.device.clone(),
            address: end.peer_address.to_string(),
            mac: end.peer_mac.clone(),
        });
        if parts.diverted.contains(&end.device) {
            let mark = end.numbers.mark();
            ns.routes.push(Route {
                table: end.numbers.table(),
                dst: "default".into(),
                via: end.peer_address.to_string(),
                dev: end.device.clone(),
            });
            ns.ip_rules.push(IpRule {
                pref: Rule::LoopGuard.preference(),
                fwmark: mark,
                fwmask: u32::MAX,
                to: format!("{}/32", end.peer_underlay),
                table: MAIN_TABLE,
            });
            ns.ip_rules.push(IpRule {
                pref: Rule::Divert.preference(),
                fwmark: mark,
                fwmask: u32::MAX,
                to: String::new(),
                table: end.numbers.table(),
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
fn table(_settings: &Settings, p: &NodeParts, stand_in: &BTreeMap<Ipv4Addr, Ipv4Addr>) -> Option<NftTable> {
    let steered = |a: &Ipv4Addr| *stand_in.get(a).unwrap_or(a);
    use NftType::{Ifname, InetProto, InetService, Ipv4Addr as Addr, Mark};
    use Selector::{CtDirection, CtMark, Iifname, IpDaddr, IpSaddr, L4proto, Oifname, ThDport, ThSport};
    let mut sets = Vec::new();
    let mut pre = Vec::new();
    let mut post = Vec::new();
    let mut mangle = Vec::new();

    if !p.publish_port.is_empty() {
        let elements = p
            .publish_port
            .iter()
            .map(|((i, pr, port), (a, to))| {
                el(vec![ifname(i), proto(*pr), port_v(*port, *port)], vec![addr(*a), port_v(*to, *to)])
            })
            .collect();
        sets.push(dnat_target_map(set(
            MAP_PUBLISH_PORT,
            &[Ifname, InetProto, InetService],
            &[Addr, InetService],
            false,
            elements,
        )));
        pre.push(dnat_map(&[Iifname, L4proto, ThDport], MAP_PUBLISH_PORT));
    }
    if !p.publish_range.is_empty() {
        let elements = p
            .publish_range
            .iter()
            .map(|((i, pr, (a, b)), to)| el(vec![port_v(*a, *b), ifname(i), proto(*pr)], vec![addr(*to)]))
            .collect();
        sets.push(dnat_target_map(set(MAP_PUBLISH_RANGE, &[InetService, Ifname, InetProto], &[Addr], true, elements)));
        pre.push(dnat_map(&[ThDport, Iifname, L4proto], MAP_PUBLISH_RANGE));
    }
    if !p.link_port.is_empty() {
        let elements = p
            .link_port
            .iter()
            .map(|((i, me, pr, port), (a, to))| {
                let key = vec![ifname(i), addr(steered(me)), proto(*pr), port_v(*port, *port)];
                el(key, vec![addr(*a), port_v(*to, *to)])
            })
            .collect();
        sets.push(dnat_target_map(set(
            MAP_LINK_PORT,
            &[Ifname, Addr, InetProto, InetService],
            &[Addr, InetService],
            false,
            elements,
        )));
        pre.push(dnat_map(&[Iifname, IpDaddr, L4proto, ThDport], MAP_LINK_PORT));
    }
    if !p.link_range.is_empty() {
        let elements = p
            .link_range
            .iter()
            .map(|((i, me, pr, (a, b)), to)| {
                el(vec![port_v(*a, *b), ifname(i), addr(steered(me)), proto(*pr)], vec![addr(*to)])
            })
            .collect();
        sets.push(dnat_target_map(set(
            MAP_LINK_RANGE,
            &[InetService, Ifname, Addr, InetProto],
            &[Addr],
            true,
            elements,
        )));
        pre.push(dnat_map(&[ThDport, Iifname, IpDaddr, L4proto], MAP_LINK_RANGE));
    }
    let (port, range) = split(&p.claim, |(o, a, pr)| (vec![ifname(o), addr(*a), proto(*pr)], vec![]));
    if !port.is_empty() {
        sets.push(set(SET_CLAIM_PORT, &[Ifname, Addr, InetProto, InetService], &[], false, port));
        post.push(rule(vec![lookup(&[Oifname, IpDaddr, L4proto, ThDport], SET_CLAIM_PORT)], vec![identity_snat()]));
    }
    if !range.is_empty() {
        sets.push(set(SET_CLAIM_RANGE, &[InetService, Ifname, Addr, InetProto], &[], true, range));
        post.push(rule(vec![lookup(&[ThDport, Oifname, IpDaddr, L4proto], SET_CLAIM_RANGE)], vec![identity_snat()]));
    }
    let (port, range) = split(&p.reply_claim, |(a, pr)| (vec![addr(*a), proto(*pr)], vec![]));
    // Only a reply that leaves into one of kuport's links: there the CNI's egress masquerade
    // would rewrite it, and kuport alone decides which replies go that way.
    let into_link = || compare(Oifname, CmpOp::Eq, ifname(&format!("{}*", kuport_proto::owned::LINK_PREFIX)), 0);
    if !port.is_empty() {
        sets.push(set(SET_REPLY_CLAIM_PORT, &[Addr, InetProto, InetService], &[], false, port));
        let claim = lookup(&[IpSaddr, L4proto, ThSport], SET_REPLY_CLAIM_PORT);
        post.push(rule(vec![into_link(), claim], vec![identity_snat()]));
    }
    if !range.is_empty() {
        sets.push(set(SET_REPLY_CLAIM_RANGE, &[InetService, Addr, InetProto], &[], true, range));
        let claim = lookup(&[ThSport, IpSaddr, L4proto], SET_REPLY_CLAIM_RANGE);
        post.push(rule(vec![into_link(), claim], vec![identity_snat()]));
    }
    let (port, range) = split(&p.return_mark, |(a, pr, m)| (vec![addr(*a), proto(*pr)], vec![mark(*m)]));
    let mark_from = |k: &[Selector], map| {
        let from = SetMark { from: Some(set_mark::From::Map(map_lookup(k, map))) };
        rule(vec![], vec![stmt(nft_statement::Kind::MetaMarkSet(from))])
    };
    if !port.is_empty() {
        sets.push(set(MAP_RETURN_MARK_PORT, &[Addr, InetProto, InetService], &[Mark], false, port));
        mangle.push(mark_from(&[IpSaddr, L4proto, ThSport], MAP_RETURN_MARK_PORT));
    }
    if !range.is_empty() {
        sets.push(set(MAP_RETURN_MARK_RANGE, &[InetService, Addr, InetProto], &[Mark], true, range));
        mangle.push(mark_from(&[ThSport, IpSaddr, L4proto], MAP_RETURN_MARK_RANGE));
    }
    if !p.ct_mark.is_empty() {
        let elements = p.ct_mark.iter().map(|(dev, m)| el(vec![ifname(dev)], vec![mark(*m)])).collect();
        let mut s = set(MAP_CT_MARK, &[Ifname], &[Mark], false, elements);
        s.counter = false;
        sets.push(s);
        let save = SetMark { from: Some(set_mark::From::Map(map_lookup(&[Iifname], MAP_CT_MARK))) };
        mangle.push(rule(vec![], vec![stmt(nft_statement::Kind::CtMarkSet(save))]));
        let restore = SetMark { from: Some(set_mark::From::Selector(CtMark as i32)) };
        // The replies of connections a link brought in: never the request itself, which is in
        // the original direction, whatever device either arrives on.
        let reply = compare(CtDirection, CmpOp::Eq, value(nft_value::Value::Id(CT_DIRECTION_REPLY)), 0);
        let ours = compare(CtMark, CmpOp::Eq, mark(MARK_PREFIX), MARK_PREFIX_MASK);
        mangle.push(rule(vec![reply, ours], vec![stmt(nft_statement::Kind::MetaMarkSet(restore))]));
    }
    if pre.is_empty() && post.is_empty() && mangle.is_empty() {
        return None;
    }
    let mut chains = Vec::new();
    for (name, type_, prio, rules) in [
        (CHAIN_PRE, ChainType::Nat, PRE_PRIORITY, pre),
        (CHAIN_POST, ChainType::Nat, POST_PRIORITY, post),
        (CHAIN_MANGLE, ChainType::Filter, MANGLE_PRIORITY, mangle),
    ] {
        if rules.is_empty() {
            continue;
        }
        let hook = if name == CHAIN_POST { Hook::Postrouting } else { Hook::Prerouting };
        chains.push(NftChain {
            name: name.into(),
            base: Some(BaseChain { r#type: type_ as i32, hook: hook as i32, priority: prio, policy: 0 }),
            rules,
        });
    }
    Some(NftTable { family: NftFamily::Ip as i32, name: TABLE.into(), sets, chains })
}

/// Merges each group's port ranges, then splits the merged intervals: single ports keyed in the
/// natural order (the group's fields, then the port) for a hash set, ranges keyed ports first for
/// an interval set. `fields` gives a group's key fields and data.
fn split<K>(
    groups: &BTreeMap<K, Vec<Ports>>,
    fields: impl Fn(&K) -> (Vec<NftValue>, Vec<NftValue>),
) -> (Vec<NftElement>, Vec<NftElement>) {
    let (mut port, mut range) = (Vec::new(), Vec::new());
    for (group, ranges) in groups {
        let (key, data) = fields(group);
        for (a, b) in merge(ranges) {
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
        elements,
        ..Default::default()
    }
}

/// A DNAT map: when an element's target changes, the executor deletes the UDP flows still on
/// the old path (docs/portmap/datapath.md, "UDP flows when a target moves").
fn dnat_target_map(set: NftSet) -> NftSet {
    NftSet { flush_udp_flows: true, ..set }
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
fn addr(a: Ipv4Addr) -> NftValue {
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
fn dnat_map(k: &[Selector], map: &str) -> NftRule {
    let nat = Nat {
        kind: NatKind::Dnat as i32,
        family: NftFamily::Ip as i32,
        to: Some(kuport_proto::v1::nat::To::Map(map_lookup(k, map))),
    };
    rule(vec![], vec![stmt(nft_statement::Kind::Nat(nat))])
}
/// `snat ip to ip saddr`: changes nothing, but claims the connection's source NAT for this
/// hook, so the CNI's masquerade, which sorts later, never rewrites the client's address.
fn identity_snat() -> NftStatement {
    let nat = Nat {
        kind: NatKind::Snat as i32,
        family: NftFamily::Ip as i32,
        to: Some(kuport_proto::v1::nat::To::Selector(Selector::IpSaddr as i32)),
    };
    stmt(nft_statement::Kind::Nat(nat))
}
