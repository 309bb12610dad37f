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
//! interface, protocol and port, not by the destination, so they translate the rewritten
//! packet as they would the original.
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
//! IPv4 only: the IPv6 stand-ins (checksum-neutral, in `fd6b:7570::/96`) come with dual-stack.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use kuport_proto::build::{addr, base_chain, element, ifname, ip_daddr_set_map, port, ports, proto, rule, set};
use kuport_proto::v1::{ChainPolicy, ChainType, Hook, L4Proto, NftChain, NftSet, NftType, Selector};

pub const CHAIN_STEER: &str = "kup-steer";
/// Single ports: (interface, address, protocol, port) to the stand-in.
pub const MAP_STEER_PORT: &str = "steer_port";
/// Ranges: (ports, interface, address, protocol) to the stand-in.
pub const MAP_STEER_RANGE: &str = "steer_range";

/// `dstnat - 20`, after a mesh's mangle rules at -150 and kuport's own marks at -140 (which
/// all still see the dialed address: netbird marks packets by `fib daddr type local` there,
/// and a rewrite before it broke netbird on a live cluster), and before a host firewall at
/// -110. The gap of 10 on the firewall's side leaves room for a firewall a little earlier.
pub const STEER_PRIORITY: i32 = super::datapath::PRIORITY_DSTNAT - 20;

/// The stand-ins' network, 169.254.76.0/24: link-local, so never a node's or a client's address,
/// and beside the links' 169.254.77.0/24.
pub const STAND_IN_NET: [u8; 3] = [169, 254, 76];

type Ports = (u16, u16);

/// The stand-in of each of a node's published addresses, in 169.254.76.1 to .254.
///
/// The rule: an address's preferred host number is a hash of its four bytes (FNV-1a) into 1 to
/// 254; addresses are taken in ascending order and each gets its preferred number, or on a
/// clash the next free one after it. So an address keeps its stand-in when another is added or
/// removed, unless the two hash alike. A stand-in that moves breaks nothing: it lives only
/// between this chain and the DNAT in one packet's pass through prerouting, and neither
/// conntrack nor any map remembers it. More than 254 addresses on one node are not steered past
/// the 254th.
pub fn stand_ins(addresses: &BTreeSet<Ipv4Addr>) -> BTreeMap<Ipv4Addr, Ipv4Addr> {
    let mut taken = [false; 256];
    let mut out = BTreeMap::new();
    for a in addresses {
        let mut h = preferred(*a);
        let mut tries = 0;
        while taken[usize::from(h)] && tries < 254 {
            h = if h == 254 { 1 } else { h + 1 };
            tries += 1;
        }
        if taken[usize::from(h)] {
            break;
        }
        taken[usize::from(h)] = true;
        let [x, y, z] = STAND_IN_NET;
        out.insert(*a, Ipv4Addr::new(x, y, z, h));
    }
    out
}

/// FNV-1a of the address's bytes, folded into 1..=254.
fn preferred(a: Ipv4Addr) -> u8 {
    let mut h: u32 = 0x811c_9dc5;
    for b in a.octets() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h % 254) as u8 + 1
}

/// What one node publishes: for each accepting interface and protocol, the published ports.
pub type Published = BTreeMap<(String, L4Proto), Vec<Ports>>;

/// Where a node receives requests to published ports addressed to itself: (arrival interface,
/// destination, protocol) to the ports. An accepting interface with each of its addresses, and
/// on the pod's node a link with this end's address.
pub type Destinations = BTreeMap<(String, Ipv4Addr, L4Proto), Vec<Ports>>;

/// The published ports of each accepting interface at each of its IPv4 addresses. `addresses`
/// gives an interface's addresses as the executor reports them (`203.0.113.9` or
/// `203.0.113.9/24`; IPv6 ones are skipped).
pub fn accepting<'a>(published: &Published, addresses: impl Fn(&str) -> &'a [String]) -> Destinations {
    let mut out = Destinations::new();
    for ((iface, pr), list) in published {
        let v4 = addresses(iface).iter().filter_map(|a| a.split('/').next().and_then(|a| a.parse().ok()));
        for dst in v4.collect::<BTreeSet<Ipv4Addr>>() {
            out.entry((iface.clone(), dst, *pr)).or_default().extend(list);
        }
    }
    out
}

/// One node's steering: the stand-in of each destination address, and the chain and its maps.
pub struct Steering {
    pub stand_in: BTreeMap<Ipv4Addr, Ipv4Addr>,
    pub sets: Vec<NftSet>,
    pub chain: NftChain,
}

/// The steering chain and its maps for one node, or None when it receives nothing published.
pub fn steering(destinations: &Destinations) -> Option<Steering> {
    let all: BTreeSet<Ipv4Addr> = destinations.keys().map(|(_, a, _)| *a).collect();
    let stand_in = stand_ins(&all);
    let (mut single, mut range) = (Vec::new(), Vec::new());
    for ((iface, dst, pr), list) in destinations {
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
    use NftType::{Ifname, InetProto, InetService, Ipv4Addr as Addr};
    use Selector::{Iifname, IpDaddr, L4proto, ThDport};
    let (mut sets, mut rules) = (Vec::new(), Vec::new());
    if !single.is_empty() {
        let s = set(MAP_STEER_PORT, &[Ifname, Addr, InetProto, InetService], &[Addr], single);
        sets.push(NftSet { counter: true, ..s });
        rules.push(rule(vec![], vec![ip_daddr_set_map(&[Iifname, IpDaddr, L4proto, ThDport], MAP_STEER_PORT)]));
    }
    if !range.is_empty() {
        let s = set(MAP_STEER_RANGE, &[InetService, Ifname, Addr, InetProto], &[Addr], range);
        sets.push(NftSet { counter: true, interval: true, ..s });
        rules.push(rule(vec![], vec![ip_daddr_set_map(&[ThDport, Iifname, IpDaddr, L4proto], MAP_STEER_RANGE)]));
    }
    if rules.is_empty() {
        return None;
    }
    let chain =
        base_chain(CHAIN_STEER, ChainType::Filter, Hook::Prerouting, STEER_PRIORITY, ChainPolicy::Accept, rules);
    Some(Steering { stand_in, sets, chain })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Ipv4Addr {
        s.parse().expect("an address")
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
            assert_eq!(s.octets()[..3], STAND_IN_NET);
            assert!((1..=254).contains(&s.octets()[3]));
        }
    }

    #[test]
    fn clashing_addresses_get_distinct_stand_ins() {
        let many: BTreeSet<_> =
            (0..=255u8).flat_map(|x| [Ipv4Addr::new(10, 0, x, 1), Ipv4Addr::new(10, 1, x, 1)]).collect();
        let s = stand_ins(&many);
        assert_eq!(s.len(), 254, "every host number used once, the rest not steered");
        let distinct: BTreeSet<_> = s.values().collect();
        assert_eq!(distinct.len(), 254);
    }

    #[test]
    fn steering_keys_each_published_address_and_skips_ipv6() {
        let published: Published = [
            (("enp1s0".to_string(), L4Proto::Udp), vec![(27015, 27115)]),
            (("enp1s0".to_string(), L4Proto::Tcp), vec![(3000, 3000), (3000, 3000)]),
        ]
        .into();
        let addrs = vec!["203.0.113.9/24".to_string(), "2001:db8::9/64".to_string()];
        let s = steering(&accepting(&published, |_| addrs.as_slice())).expect("steering");
        assert_eq!(s.sets.len(), 2);
        assert_eq!(s.sets[0].elements.len(), 1, "duplicates merged, IPv6 skipped");
        assert_eq!(s.sets[1].elements.len(), 1);
        assert!(s.sets[1].interval);
        assert_eq!(s.chain.rules.len(), 2);
        assert_eq!(s.stand_in.keys().collect::<Vec<_>>(), [&a("203.0.113.9")]);
        assert!(steering(&accepting(&published, |_| &[])).is_none());
    }

    #[test]
    fn a_link_and_an_interface_share_one_stand_in_rule() {
        let published: Published = [(("enp1s0".to_string(), L4Proto::Tcp), vec![(3000, 3000)])].into();
        let addrs = vec!["203.0.113.9/24".to_string()];
        let mut d = accepting(&published, |_| addrs.as_slice());
        d.insert(("kup-1".to_string(), a("169.254.77.3"), L4Proto::Tcp), vec![(8080, 8080)]);
        let s = steering(&d).expect("steering");
        let both: BTreeSet<_> = [a("203.0.113.9"), a("169.254.77.3")].into();
        assert_eq!(s.stand_in, stand_ins(&both));
        assert_eq!(s.sets[0].elements.len(), 2);
    }
}
