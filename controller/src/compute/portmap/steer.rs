//! Steering past a host firewall: docs/portmap/firewall.md.
//!
//! A host firewall such as Talos's drops, in a filter chain at prerouting -110, new connections
//! whose destination is one of the node's own addresses (`fib daddr type local`). kuport's DNAT
//! is a nat chain, and the kernel runs every nat chain from its own hook at -100, whatever the
//! chain's priority: the firewall always sees the request first. So on every node that
//! publishes, a filter chain at [`STEER_PRIORITY`] rewrites the destination of each request to
//! a published port from the node's address to a stand-in address from 169.254.76.0/24, which
//! is no address of the node. Conntrack has recorded the dialed address already (it runs at
//! -200), so the reply still leaves from it. kuport's publish maps are keyed by the arrival
//! interface, the stand-in, the protocol and the port, so they translate only what was
//! addressed to the node: a packet routed through it to another address on a published port
//! keeps its destination and is not delivered.
//!
//! On the pod's node a request arrives over kuport's link addressed to this end of the link,
//! also an address of the node: the same chain rewrites it to the link address's stand-in, and
//! the link maps (`link_port`, `link_range` in datapath.rs) are keyed by that stand-in. One
//! stand-in rule covers both: every address a node is steered from, accepting interfaces' and
//! links' alike.
//!
//! The keys are the arrival interface, the destination, the protocol and the port, so only
//! packets to a published address and port are rewritten. Single ports live in a hash map in
//! that order; ranges in an interval map keyed ports first (datapath.rs explains why).
//!
//! IPv6 has the same chain and maps, suffixed `6`, with stand-ins in `fd6b:7570::/96` chosen so
//! that no checksum changes ([`stand_ins`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use kuport_proto::build::{
    accept, addr, base_chain, chain, compare, counter, ct_count, ct_state, drop, dynamic_set, element, eq, id, ifname,
    jump_to, limit, port, ports, proto, rule, set, set_update, verdict, verdict_map,
};
use kuport_proto::v1::{
    AddressSet, ChainPolicy, ChainType, CmpOp, Hook, L4Proto, NftChain, NftElement, NftRule, NftSet, NftStatement,
    NftType, Selector, VerdictKind, nft_statement,
};

use super::admission::SourceLimit;
use super::datapath::Family;

pub const CHAIN_STEER: &str = "kup-steer";
/// `ct direction reply` (IP_CT_DIR_REPLY).
const CT_DIRECTION_REPLY: u32 = 1;
/// Single ports: (interface, address, protocol, port) to the stand-in; `steer_port6` for IPv6.
pub const MAP_STEER_PORT: &str = "steer_port";
/// Single ports with an allow-list: (interface, address, protocol, port) to a jump to the
/// mapping's guard chain, looked up for every packet (docs/portmap/guard.md).
pub const MAP_GUARD_PORT: &str = "guard_port";
/// Ranges with an allow-list: (ports, interface, address, protocol) to the jump.
pub const MAP_GUARD_RANGE: &str = "guard_range";
/// The guard chains' names begin so: `kup-guard-TAG`, `kup-guard6-TAG`. Each returns what its
/// mapping's list admits; its last rule counts and drops the rest.
pub const CHAIN_GUARD: &str = "kup-guard";
/// Ranges: (ports, interface, address, protocol) to the stand-in; `steer_range6` for IPv6.
pub const MAP_STEER_RANGE: &str = "steer_range";
/// Rate-limited single ports: (interface, address, protocol, port) to a jump to the mapping's
/// limit chain (docs/portmap/guard.md, "Rate limits").
pub const MAP_LIMIT_PORT: &str = "limit_port";
/// Rate-limited ranges: (ports, interface, address, protocol) to the jump.
pub const MAP_LIMIT_RANGE: &str = "limit_range";
/// The limit chains' names begin so: `kup-limit-TAG`, `kup-limit6-TAG`.
pub const CHAIN_LIMIT: &str = "kup-limit";
/// Per (client address, mapping tag): the new-connection token bucket, filled by the kernel.
pub const SET_RATE: &str = "rate";
/// Per (client address, mapping tag): the connections the client holds.
pub const SET_CONNECTIONS: &str = "connections";
/// Each dynamic set's bound: so many clients per family are tracked at once. A multiple of
/// 65,536, which the kernel's preallocation hint reads as none (65,535 preallocates 2 MB);
/// about 190 bytes per tracked client. A full set tracks no new client: it fails open.
pub const TRACKED_CLIENTS: u32 = 65_536;
/// How long a client's bucket outlives its last new connection.
pub const RATE_TIMEOUT_SECONDS: u32 = 60;

/// `dstnat - 20`, after a mesh's mangle rules at -150 and kuport's own marks at -140 (which
/// all still see the dialed address: netbird marks packets by `fib daddr type local` there,
/// and a rewrite before it broke netbird on a live cluster), and before a host firewall at
/// -110. The gap of 10 on the firewall's side leaves room for a firewall a little earlier.
pub const STEER_PRIORITY: i32 = super::datapath::PRIORITY_DSTNAT - 20;

/// The IPv4 stand-ins' network, 169.254.76.0/24: link-local, so never a node's or a client's
/// address, and beside the links' 169.254.77.0/24.
pub const STAND_IN_NET: [u8; 3] = [169, 254, 76];
/// The IPv6 stand-ins' network, fd6b:7570::/96 (a ULA, "kp"), the first six of its words.
pub const STAND_IN_NET6: [u16; 6] = [0xfd6b, 0x7570, 0, 0, 0, 0];

type Ports = (u16, u16);

/// The stand-in of each of a node's published addresses: IPv4 ones in 169.254.76.1 to .254,
/// IPv6 ones in fd6b:7570::/96.
///
/// The rule: an address's preferred number is a hash of its bytes (FNV-1a), in 1 to 254 for
/// IPv4 and in 1 to 65,535 for IPv6 (the stand-in's seventh word); addresses are taken in
/// ascending order and each gets its preferred number, or on a clash the next free one after
/// it. So an address keeps its stand-in when another is added or removed, unless the two hash
/// alike. A stand-in that moves breaks nothing: it lives only between this chain and the DNAT in
/// one packet's pass through prerouting, and neither conntrack nor any map remembers it. More
/// than 254 IPv4 addresses on one node are not steered past the 254th.
///
/// An IPv6 stand-in's last word makes its one's-complement sum that of the address it stands in
/// for (RFC 6296's checksum neutrality): IPv6 has no header checksum, and the transport
/// checksum's pseudo-header sum stays the same, so the rewrite touches no checksum.
pub fn stand_ins(addresses: &BTreeSet<IpAddr>) -> BTreeMap<IpAddr, IpAddr> {
    let mut out = BTreeMap::new();
    let mut taken4 = [false; 256];
    let mut taken6 = BTreeSet::new();
    for a in addresses {
        match a {
            IpAddr::V4(a) => {
                let Some(h) = next_free(preferred(&a.octets(), 254), 254, |h| taken4[h as usize]) else {
                    continue;
                };
                taken4[h as usize] = true;
                let [x, y, z] = STAND_IN_NET;
                out.insert(IpAddr::V4(*a), IpAddr::V4(Ipv4Addr::new(x, y, z, h as u8)));
            }
            IpAddr::V6(a) => {
                let Some(h) = next_free(preferred(&a.octets(), 65_535), 65_535, |h| taken6.contains(&h)) else {
                    continue;
                };
                taken6.insert(h);
                out.insert(IpAddr::V6(*a), IpAddr::V6(neutral(*a, h as u16)));
            }
        }
    }
    out
}

/// The first number from `first` on, wrapping within 1..=`last`, that is not `taken`.
fn next_free(first: u32, last: u32, taken: impl Fn(u32) -> bool) -> Option<u32> {
    (0..last).map(|i| (first - 1 + i) % last + 1).find(|h| !taken(*h))
}

/// FNV-1a of the address's bytes, folded into 1..=`last`.
fn preferred(bytes: &[u8], last: u32) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % last + 1
}

/// fd6b:7570::`number`:X, with X chosen so that its one's-complement sum equals `a`'s.
fn neutral(a: Ipv6Addr, number: u16) -> Ipv6Addr {
    let mut w = [0u16; 8];
    w[..6].copy_from_slice(&STAND_IN_NET6);
    w[6] = number;
    // X = sum(a) - sum(the other words), in one's-complement arithmetic: adding the complement.
    let fixed = ones_sum(&w[..7]);
    w[7] = ones_add(ones_sum(&a.segments()), !fixed);
    Ipv6Addr::from(w)
}

fn ones_add(a: u16, b: u16) -> u16 {
    let s = u32::from(a) + u32::from(b);
    ((s & 0xffff) + (s >> 16)) as u16
}

/// The one's-complement sum of 16-bit words.
pub fn ones_sum(words: &[u16]) -> u16 {
    words.iter().fold(0, |s, w| ones_add(s, *w))
}

/// What one node publishes: for each accepting interface and protocol, the published ports.
pub type Published = BTreeMap<(String, L4Proto), Vec<Ports>>;

/// Where a node receives requests to published ports addressed to itself: (arrival interface,
/// destination, protocol) to the ports. An accepting interface with each of its addresses, and
/// on the pod's node a link with this end's addresses.
pub type Destinations = BTreeMap<(String, IpAddr, L4Proto), Vec<Ports>>;

/// An interface's addresses as the executor reports them (`203.0.113.9`, `2001:db8::9/64`).
pub fn addresses(reported: &[String]) -> BTreeSet<IpAddr> {
    reported.iter().filter_map(|a| a.split('/').next().and_then(|a| a.parse().ok())).collect()
}

/// The ports published in family `fam` on each accepting interface, at each of its addresses of
/// that family. `addresses` gives an interface's addresses as the executor reports them.
pub fn accepting<'a>(published: &Published, fam: Family, addresses: impl Fn(&str) -> &'a [String]) -> Destinations {
    let mut out = Destinations::new();
    for ((iface, pr), list) in published {
        for dst in self::addresses(addresses(iface)).into_iter().filter(|a| fam.holds(a)) {
            out.entry((iface.clone(), dst, *pr)).or_default().extend(list);
        }
    }
    out
}

/// What a node enforces per published mapping, at each destination: (arrival interface,
/// destination, protocol) to each mapping's ports and its `T`.
pub type PerMapping<T> = BTreeMap<(String, IpAddr, L4Proto), Vec<(Ports, T)>>;

/// The allow-lists of the mappings a node receives: the prefixes of the destination's family
/// each admits (none: the family is closed to every client).
pub type Guards = PerMapping<Vec<IpNet>>;

/// The per-source bounds of the mappings a node receives.
pub type Limits = PerMapping<SourceLimit>;

/// [`accepting`] for what a mapping enforces: each mapping at each address of its interface.
pub fn per_address<'a, 'm, T: Clone + 'm>(
    by_mapping: impl IntoIterator<Item = (&'m (String, L4Proto, Ports), &'m T)>,
    fam: Family,
    addresses: impl Fn(&str) -> &'a [String],
) -> PerMapping<T> {
    let mut out = PerMapping::new();
    for ((iface, pr, ports), what) in by_mapping {
        for dst in self::addresses(addresses(iface)).into_iter().filter(|a| fam.holds(a)) {
            out.entry((iface.clone(), dst, *pr)).or_default().push((*ports, what.clone()));
        }
    }
    out
}

/// The allow-list rules of one family, first in the chain so that a refused packet is dropped
/// before anything rewrites it (docs/portmap/guard.md): every packet to a guarded mapping jumps,
/// through a verdict map, to the mapping's chain, whose last rule counts and drops it when its
/// source is in none of the mapping's prefixes. A family the list closes to every client drops
/// every packet; a family the list opens to every client (`0.0.0.0/0`) needs no chain. A mapping
/// in `limited` goes on from its guard chain to its limit chain: its new connections pay one
/// dispatch lookup, not two. Returns the rules and the guarded mappings' tags, each with whether
/// its guard chain goes on to its limit chain.
fn guard_rules(
    fam: Family,
    guards: &Guards,
    limited: &BTreeSet<u32>,
    ifaces: &BTreeSet<&str>,
    sets: &mut Vec<NftSet>,
    chains: &mut Vec<NftChain>,
) -> (Vec<NftRule>, BTreeMap<u32, bool>) {
    let (mut single, mut range) = (Vec::new(), Vec::new());
    let mut guarded = BTreeMap::new();
    for ((iface, dst, pr), list) in guards.iter().filter(|((_, a, _), _)| fam.holds(a)) {
        for ((a, b), nets) in list {
            let tag = tag(ifaces, iface, *pr, *a);
            let then = limited.contains(&tag).then(|| chain_name(CHAIN_LIMIT, fam, tag));
            let Some(rules) = allow_list_rules(fam, nets, then.as_deref()) else { continue };
            let name = chain_name(CHAIN_GUARD, fam, tag);
            if let std::collections::btree_map::Entry::Vacant(e) = guarded.entry(tag) {
                // The last rule drops; any before it admits and goes on.
                e.insert(then.is_some() && rules.len() > 1);
                chains.push(chain(&name, rules));
            }
            jump_element(&mut single, &mut range, (iface, *dst, *pr), (*a, *b), &name);
        }
    }
    // Every packet, not only a connection's first: a narrowed list cuts established flows.
    (dispatch(fam, single, range, [MAP_GUARD_PORT, MAP_GUARD_RANGE], false, sets), guarded)
}

/// A guard chain's rules for a mapping's list `nets`, in family `fam`: a source in one of its
/// prefixes of that family is admitted (`ip saddr 192.0.2.0/24 return`, or `goto` the mapping's
/// limit chain `then`), overlapping prefixes merged, and the last rule counts and drops every
/// other (`counter drop`). No prefix of the family closes it: `counter drop` alone. None: the
/// list admits every source of the family (`0.0.0.0/0`). A rule per prefix, not a set: an
/// anonymous set per mapping made a cold apply of 50,000 guarded mappings quadratic in the
/// kernel (docs/decisions.md).
pub fn allow_list_rules(fam: Family, nets: &[IpNet], then: Option<&str>) -> Option<Vec<NftRule>> {
    let nets = IpNet::aggregate(&nets.iter().filter(|n| fam.holds(&n.addr())).copied().collect());
    if nets.iter().any(|n| n.prefix_len() == 0) {
        return None;
    }
    let text = |n: &IpNet| if n.prefix_len() == n.max_prefix_len() { n.addr().to_string() } else { n.to_string() };
    let admit = || match then {
        Some(limit) => verdict(VerdictKind::Goto, limit),
        None => verdict(VerdictKind::Return, ""),
    };
    let mut rules: Vec<NftRule> =
        nets.iter().map(|n| rule(vec![eq(fam.saddr(), addr(text(n)))], vec![admit()])).collect();
    rules.push(rule(vec![], vec![counter(), drop()]));
    Some(rules)
}

/// A per-mapping chain's name: `kup-guard-TAG`, `kup-limit6-TAG` (TAG in hex, [`tag`]).
pub fn chain_name(base: &str, fam: Family, tag: u32) -> String {
    format!("{}-{tag:x}", fam.name(base))
}

/// A dispatch element: `(iface, dst, pr)` and the ports `(a, b)` jump to `chain`, in the hash
/// map's shape for one port (`single`), the interval map's for a range (`range`).
fn jump_element(
    single: &mut Vec<NftElement>,
    range: &mut Vec<NftElement>,
    (iface, dst, pr): (&str, IpAddr, L4Proto),
    (a, b): (u16, u16),
    chain: &str,
) {
    let (a, b) = (u32::from(a), u32::from(b));
    if a == b {
        single.push(element(vec![ifname(iface), addr(dst), proto(pr), port(a)], vec![jump_to(chain)]));
    } else {
        range.push(element(vec![ports(a, b), ifname(iface), addr(dst), proto(pr)], vec![jump_to(chain)]));
    }
}

/// The dispatch of one family: a verdict map per shape (`maps`: single ports in a hash map,
/// ranges in an interval map keyed ports first, like the steering maps) and the rule that looks
/// it up, for new connections only when `new_only`.
fn dispatch(
    fam: Family,
    single: Vec<NftElement>,
    range: Vec<NftElement>,
    maps: [&str; 2],
    new_only: bool,
    sets: &mut Vec<NftSet>,
) -> Vec<NftRule> {
    use NftType::{Ifname, InetProto, InetService, Verdict};
    use Selector::{Iifname, L4proto, ThDport};
    let (a, daddr) = (fam.addr_type(), fam.daddr());
    let shapes = [
        (single, maps[0], [Ifname, a, InetProto, InetService], [Iifname, daddr, L4proto, ThDport], false),
        (range, maps[1], [InetService, Ifname, a, InetProto], [ThDport, Iifname, daddr, L4proto], true),
    ];
    let mut rules = Vec::new();
    for (elements, map, key, sel, interval) in shapes {
        if elements.is_empty() {
            continue;
        }
        let map = fam.name(map);
        sets.push(NftSet { interval, ..set(&map, &key, &[Verdict], elements) });
        let matches = if new_only { vec![ct_state(ct_state::NEW)] } else { vec![] };
        rules.push(rule(matches, vec![verdict_map(&sel, &map)]));
    }
    rules
}

/// The tag of a mapping on a node: its chains' names, and the constant that scopes its clients'
/// state in the shared dynamic sets. The mapping's first port and protocol, and the index of its
/// interface among `ifaces` (the node's protected interfaces: those of a mapping with an
/// allow-list or a rate limit). Admission keeps mappings on one interface apart, so no two
/// mappings of a node share a tag; a mapping's clients are bounded per accepting interface.
pub fn tag(ifaces: &BTreeSet<&str>, iface: &str, pr: L4Proto, first: u16) -> u32 {
    let index = ifaces.iter().position(|i| *i == iface).unwrap_or(0) as u32;
    (index << 17) | (u32::from(pr == L4Proto::Udp) << 16) | u32::from(first)
}

/// The tags of the mappings of `by_mapping` in family `fam`.
fn tags<T>(fam: Family, by_mapping: &PerMapping<T>, ifaces: &BTreeSet<&str>) -> BTreeSet<u32> {
    let of_fam = by_mapping.iter().filter(|((_, a, _), _)| fam.holds(a));
    of_fam.flat_map(|((iface, _, pr), list)| list.iter().map(|((a, _), _)| tag(ifaces, iface, *pr, *a))).collect()
}

/// The rate-limit rules of one family (docs/portmap/guard.md, "Rate limits"): a new connection
/// to a limited mapping reaches the mapping's chain, which counts and drops it when its client
/// is over the mapping's rate or holds its connection bound. A mapping without a guard chain is
/// reached through a verdict map; one with a guard chain (`guarded`) from that chain, and not
/// at all when its list closes the family. The clients' state lives in two dynamic sets per
/// family shared by every mapping, keyed by the client's address and the mapping's tag; the
/// chains hold each mapping's numbers.
fn limit_rules(
    fam: Family,
    limits: &Limits,
    guarded: &BTreeMap<u32, bool>,
    ifaces: &BTreeSet<&str>,
    sets: &mut Vec<NftSet>,
    chains: &mut Vec<NftChain>,
) -> Vec<NftRule> {
    let (rate, connections) = (fam.name(SET_RATE), fam.name(SET_CONNECTIONS));
    let (mut single, mut range, mut capped) = (Vec::new(), Vec::new(), false);
    let mut made = BTreeSet::new();
    for ((iface, dst, pr), list) in limits.iter().filter(|((_, a, _), _)| fam.holds(a)) {
        for ((a, b), l) in list {
            let tag = tag(ifaces, iface, *pr, *a);
            let name = chain_name(CHAIN_LIMIT, fam, tag);
            match guarded.get(&tag) {
                None => jump_element(&mut single, &mut range, (iface, *dst, *pr), (*a, *b), &name),
                Some(false) => continue,
                Some(true) => {}
            }
            if made.insert(tag) {
                let saddr = [fam.saddr()];
                let mut rules = vec![rule(
                    vec![ct_state(ct_state::NEW)],
                    vec![
                        set_update(&saddr, Some(tag), &rate, limit(u64::from(l.per_second), l.burst, true)),
                        counter(),
                        drop(),
                    ],
                )];
                if let Some(n) = l.connections {
                    capped = true;
                    rules.push(rule(
                        vec![ct_state(ct_state::NEW)],
                        vec![set_update(&saddr, Some(tag), &connections, ct_count(n, true)), counter(), drop()],
                    ));
                }
                chains.push(chain(&name, rules));
            }
        }
    }
    if made.is_empty() {
        return Vec::new();
    }
    let a = fam.addr_type();
    sets.push(dynamic_set(&rate, &[a, NftType::Mark], TRACKED_CLIENTS, RATE_TIMEOUT_SECONDS));
    if capped {
        // No timeout: an entry goes when its client's last connection does.
        sets.push(dynamic_set(&connections, &[a, NftType::Mark], TRACKED_CLIENTS, 0));
    }
    // Only a new connection is looked up: the packets of an admitted one pay nothing.
    dispatch(fam, single, range, [MAP_LIMIT_PORT, MAP_LIMIT_RANGE], true, sets)
}

/// One node's steering: the stand-in of each destination address, and the chain and its maps.
pub struct Steering {
    pub stand_in: BTreeMap<IpAddr, IpAddr>,
    pub sets: Vec<NftSet>,
    pub chain: NftChain,
    /// The mappings' guard and limit chains, which the chain jumps to.
    pub mapping_chains: Vec<NftChain>,
}

/// The steering chain and its maps for one node, or None when it receives nothing published;
/// the allow-lists of `guards` first, then the rate limits of `limits`, before any rewrite.
pub fn steering(destinations: &Destinations, guards: &Guards, limits: &Limits) -> Option<Steering> {
    let all: BTreeSet<IpAddr> = destinations.keys().map(|(_, a, _)| *a).collect();
    let stand_in = stand_ins(&all);
    let (mut sets, mut rules, mut mapping_chains) = (Vec::new(), Vec::new(), Vec::new());
    let ifaces: BTreeSet<&str> = guards.keys().chain(limits.keys()).map(|(i, _, _)| i.as_str()).collect();
    let mut guarded = Vec::new();
    for fam in Family::BOTH {
        let limited = tags(fam, limits, &ifaces);
        let (r, g) = guard_rules(fam, guards, &limited, &ifaces, &mut sets, &mut mapping_chains);
        rules.extend(r);
        guarded.push(g);
    }
    for (fam, guarded) in Family::BOTH.into_iter().zip(&guarded) {
        rules.extend(limit_rules(fam, limits, guarded, &ifaces, &mut sets, &mut mapping_chains));
    }
    for fam in Family::BOTH {
        let (mut single, mut range) = (Vec::new(), Vec::new());
        for ((iface, dst, pr), list) in destinations.iter().filter(|((_, a, _), _)| fam.holds(a)) {
            let Some(s) = stand_in.get(dst) else { continue };
            // Admission refuses overlapping mappings on one interface: merging only joins duplicates.
            for (a, b) in super::datapath::merge(list) {
                if a == b {
                    single.push(element(vec![ifname(iface), addr(dst), proto(*pr), port(u32::from(a))], vec![addr(s)]));
                } else {
                    range.push(element(
                        vec![ports(u32::from(a), u32::from(b)), ifname(iface), addr(dst), proto(*pr)],
                        vec![addr(s)],
                    ));
                }
            }
        }
        use NftType::{Ifname, InetProto, InetService};
        use Selector::{Iifname, L4proto, ThDport};
        let (a, daddr) = (fam.addr_type(), fam.daddr());
        if !single.is_empty() {
            let name = fam.name(MAP_STEER_PORT);
            let s = set(&name, &[Ifname, a, InetProto, InetService], &[a], single);
            sets.push(NftSet { counter: true, ..s });
            rules.push(rule(vec![], vec![daddr_set_map(daddr, &[Iifname, daddr, L4proto, ThDport], &name)]));
        }
        if !range.is_empty() {
            let name = fam.name(MAP_STEER_RANGE);
            let s = set(&name, &[InetService, Ifname, a, InetProto], &[a], range);
            sets.push(NftSet { counter: true, interval: true, ..s });
            rules.push(rule(vec![], vec![daddr_set_map(daddr, &[ThDport, Iifname, daddr, L4proto], &name)]));
        }
    }
    if rules.is_empty() {
        return None;
    }
    // A reply conntrack confirmed is never a request to a published port: it skips every
    // lookup below (docs/portmap/guard.md, "Replies skip the chain"). A packet conntrack could
    // not track has no direction and is looked up as before.
    rules.insert(0, rule(vec![compare(Selector::CtDirection, CmpOp::Eq, id(CT_DIRECTION_REPLY), 0)], vec![accept()]));
    let chain =
        base_chain(CHAIN_STEER, ChainType::Filter, Hook::Prerouting, STEER_PRIORITY, ChainPolicy::Accept, rules);
    Some(Steering { stand_in, sets, chain, mapping_chains })
}

/// `ip daddr set K map @m`, or `ip6 daddr set ...`.
fn daddr_set_map(daddr: Selector, key: &[Selector], map: &str) -> NftStatement {
    let a = AddressSet { selector: daddr as i32, map: Some(kuport_proto::build::map_lookup(key, map)) };
    NftStatement { kind: Some(nft_statement::Kind::AddressSet(a)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    fn steering_open(d: &Destinations) -> Option<Steering> {
        steering(d, &Guards::new(), &Limits::new())
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().expect("a prefix")).collect()
    }

    /// docs/portmap/guard.md: each guarded mapping and family gets a chain that admits what its
    /// list admits and counts and drops the rest, reached from a verdict map looked up for every
    /// packet; a guarded mapping's admitted packets go on to its limit chain, an unguarded
    /// one's new connections reach it from the limit map; one mapping's chains share its tag.
    #[test]
    fn each_guarded_mapping_has_its_own_chain_and_counter() {
        let d: Destinations = [
            (("enp1s0".to_string(), a("203.0.113.9"), L4Proto::Udp), vec![(27015, 27115), (53, 53)]),
            (("enp1s0".to_string(), a("2001:db8::9"), L4Proto::Udp), vec![(27015, 27115), (53, 53)]),
            (("wt0".to_string(), a("100.64.93.143"), L4Proto::Tcp), vec![(3000, 3000)]),
        ]
        .into();
        let list = nets(&["198.51.100.7/32", "192.0.2.0/24", "192.0.2.128/25", "2001:db8:100::/48"]);
        let guards: Guards = [
            (
                ("enp1s0".to_string(), a("203.0.113.9"), L4Proto::Udp),
                vec![((27015, 27115), list.clone()), ((53, 53), nets(&["0.0.0.0/0"]))],
            ),
            (("enp1s0".to_string(), a("2001:db8::9"), L4Proto::Udp), vec![((27015, 27115), list), ((53, 53), vec![])]),
            (("wt0".to_string(), a("100.64.93.143"), L4Proto::Tcp), vec![((3000, 3000), nets(&["10.0.0.0/8"]))]),
        ]
        .into();
        let limit = SourceLimit { per_second: 5, burst: 5, connections: None };
        let both = vec![((27015, 27115), limit), ((53, 53), limit)];
        let limits: Limits = [
            (("enp1s0".to_string(), a("203.0.113.9"), L4Proto::Udp), both.clone()),
            (("enp1s0".to_string(), a("2001:db8::9"), L4Proto::Udp), both),
        ]
        .into();
        let s = steering(&d, &guards, &limits).expect("steering");
        let mut chains = s.mapping_chains.clone();
        chains.push(s.chain.clone());
        let t = kuport_proto::build::table(kuport_proto::v1::NftFamily::Inet, "kuport", s.sets.clone(), chains);
        let text = kuport_proto::text::nft_table(&t);
        let names: BTreeSet<&str> = s.mapping_chains.iter().map(|c| c.name.as_str()).collect();
        // enp1s0 is the first protected interface, wt0 the second; UDP sets bit 16. UDP 53 over
        // IPv4 admits everyone: no guard chain, and its limit chain is reached from the limit
        // map. Over IPv6 its list admits no one: no limit chain either.
        let want = [
            "kup-guard-16987",
            "kup-guard-20bb8",
            "kup-guard6-10035",
            "kup-guard6-16987",
            "kup-limit-10035",
            "kup-limit-16987",
            "kup-limit6-16987",
        ];
        assert_eq!(names, want.into());
        for want in [
            // The /25 inside the /24 is merged; a host is listed without its /32, as nft lists
            // it. An admitted source of a limited mapping goes on to its limit chain.
            "chain kup-guard-16987 {\n\t\tip saddr 192.0.2.0/24 goto kup-limit-16987\n\t\tip saddr 198.51.100.7 goto kup-limit-16987\n\t\tcounter drop\n",
            "chain kup-guard-20bb8 {\n\t\tip saddr 10.0.0.0/8 return\n\t\tcounter drop\n",
            "chain kup-guard6-16987 {\n\t\tip6 saddr 2001:db8:100::/48 goto kup-limit6-16987\n\t\tcounter drop\n",
            // An empty list of the family closes it: every packet dropped.
            "chain kup-guard6-10035 {\n\t\tcounter drop\n",
            "chain kup-limit-16987 {\n\t\tct state new update @rate { ip saddr . 0x00016987 limit rate over 5/second } counter drop\n",
            // Every packet is looked up in the guard maps, only new connections in the limit
            // map, which holds only the mapping no guard chain leads to its limit chain.
            "\t\tiifname . ip daddr . meta l4proto . th dport vmap @guard_port\n\
             \t\tth dport . iifname . ip daddr . meta l4proto vmap @guard_range\n\
             \t\tiifname . ip6 daddr . meta l4proto . th dport vmap @guard_port6\n\
             \t\tth dport . iifname . ip6 daddr . meta l4proto vmap @guard_range6\n\
             \t\tct state new iifname . ip daddr . meta l4proto . th dport vmap @limit_port\n",
        ] {
            assert!(text.contains(want), "{want}\nnot in\n{text}");
        }
        for absent in ["@limit_range", "@limit_port6", "@limit_range6", "kup-limit6-10035"] {
            assert!(!text.contains(absent), "{absent} in\n{text}");
        }
        let port = s.sets.iter().find(|s| s.name == MAP_GUARD_PORT).expect("guard_port");
        assert_eq!(port.elements.len(), 1, "the open family has no element");
        assert_eq!(port.elements[0].data, [jump_to("kup-guard-20bb8")]);
        let limit_port = s.sets.iter().find(|s| s.name == MAP_LIMIT_PORT).expect("limit_port");
        assert_eq!(limit_port.elements.len(), 1);
        assert_eq!(limit_port.elements[0].data, [jump_to("kup-limit-10035")]);
        let rate6 = s.sets.iter().any(|s| s.name == "rate6");
        assert!(rate6, "IPv6's limit chain has its set");
    }

    #[test]
    fn stand_ins_stay_when_an_address_is_added() {
        let one: BTreeSet<_> = [a("203.0.113.9"), a("100.64.93.143")].into();
        let before = stand_ins(&one);
        let mut two = one.clone();
        two.insert(a("192.0.2.1"));
        let after = stand_ins(&two);
        for (addr, s) in &before {
            assert_eq!(after[addr], *s, "{addr} kept its stand-in");
        }
        let distinct: BTreeSet<_> = after.values().collect();
        assert_eq!(distinct.len(), 3);
        for s in after.values() {
            let IpAddr::V4(s) = s else { panic!("an IPv4 stand-in for an IPv4 address") };
            assert_eq!(s.octets()[..3], STAND_IN_NET);
            assert!((1..=254).contains(&s.octets()[3]));
        }
    }

    #[test]
    fn clashing_addresses_get_distinct_stand_ins() {
        let many: BTreeSet<_> = (0..=255u8)
            .flat_map(|x| [Ipv4Addr::new(10, 0, x, 1), Ipv4Addr::new(10, 1, x, 1)])
            .map(IpAddr::V4)
            .collect();
        let s = stand_ins(&many);
        assert_eq!(s.len(), 254, "every host number used once, the rest not steered");
        let distinct: BTreeSet<_> = s.values().collect();
        assert_eq!(distinct.len(), 254);
    }

    #[test]
    fn steering_keys_each_published_address_of_the_families_published() {
        let published: Published = [
            (("enp1s0".to_string(), L4Proto::Udp), vec![(27015, 27115)]),
            (("enp1s0".to_string(), L4Proto::Tcp), vec![(3000, 3000), (3000, 3000)]),
        ]
        .into();
        let addrs = vec!["203.0.113.9/24".to_string(), "2001:db8::9/64".to_string()];
        let s = steering_open(&accepting(&published, Family::V4, |_| addrs.as_slice())).expect("steering");
        assert_eq!(s.sets.len(), 2);
        assert_eq!(s.sets[0].elements.len(), 1, "duplicates merged, IPv6 not published");
        assert_eq!(s.sets[1].elements.len(), 1);
        assert!(s.sets[1].interval);
        assert_eq!(s.chain.rules.len(), 3, "the reply skip, then one rule per map");
        assert_eq!(s.stand_in.keys().collect::<Vec<_>>(), [&a("203.0.113.9")]);
        assert!(steering_open(&accepting(&published, Family::V4, |_| &[])).is_none());

        let mut d = accepting(&published, Family::V4, |_| addrs.as_slice());
        d.extend(accepting(&published, Family::V6, |_| addrs.as_slice()));
        let both = steering_open(&d).expect("steering");
        let names: Vec<&str> = both.sets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["steer_port", "steer_range", "steer_port6", "steer_range6"]);
        assert_eq!(both.chain.rules.len(), 5);
        assert_eq!(both.stand_in[&a("2001:db8::9")], a("fd6b:7570::5eb8:5c2d"));
    }

    #[test]
    fn a_link_and_an_interface_share_one_stand_in_rule() {
        let published: Published = [(("enp1s0".to_string(), L4Proto::Tcp), vec![(3000, 3000)])].into();
        let addrs = vec!["203.0.113.9/24".to_string()];
        let mut d = accepting(&published, Family::V4, |_| addrs.as_slice());
        d.insert(("kup-1".to_string(), a("169.254.77.3"), L4Proto::Tcp), vec![(8080, 8080)]);
        let s = steering_open(&d).expect("steering");
        let both: BTreeSet<_> = [a("203.0.113.9"), a("169.254.77.3")].into();
        assert_eq!(s.stand_in, stand_ins(&both));
        assert_eq!(s.sets[0].elements.len(), 2);
    }

    /// The example pair: 2001:db8::9 and fd6b:7570::1:bae4 sum alike.
    #[test]
    fn ipv6_stand_ins_are_checksum_neutral() {
        let IpAddr::V6(doc) = a("2001:db8::9") else { unreachable!() };
        assert_eq!(neutral(doc, 1), "fd6b:7570::1:bae4".parse::<Ipv6Addr>().expect("an address"));
        let many: BTreeSet<IpAddr> =
            (0..500u16).map(|i| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, i, 0, 0, 0, 0xffff, i))).collect();
        let s = stand_ins(&many);
        assert_eq!(s.len(), 500);
        assert_eq!(s.values().collect::<BTreeSet<_>>().len(), 500, "distinct");
        for (addr, stand_in) in &s {
            let (IpAddr::V6(addr), IpAddr::V6(stand_in)) = (addr, stand_in) else { panic!("IPv6") };
            assert_eq!(stand_in.segments()[..6], STAND_IN_NET6);
            assert_eq!(ones_sum(&addr.segments()), ones_sum(&stand_in.segments()), "{addr} and {stand_in}");
        }
    }
}
