//! Which conntrack entries a change of kuport's NAT sets leaves on a wrong path. The state says
//! which sets those are and what they hold (`NftSet.udp_flows`), and each set's key and data
//! types say where its protocol, port and address sit.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

use kuport_proto::canonical::common_ends;
use kuport_proto::v1::nft_value::Value;
use kuport_proto::v1::{ElementRun, NftElement, NftSet, NftTable, NftType, NftValue, UdpFlows};

use super::codec::Entry;

/// IPPROTO_UDP.
const UDP: u8 = 17;

/// Which conntrack entries to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleFlows {
    /// IPPROTO_TCP (6) or IPPROTO_UDP (17); entries without ports never match.
    pub protocol: u8,
    /// Ports, inclusive: the original direction's destination ports, except for
    /// [`StalePath::Masqueraded`], where they are the server's (the reply's source ports).
    pub ports: RangeInclusive<u16>,
    pub path: StalePath,
}

/// The path a stale entry holds its flow on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StalePath {
    /// Translated to this address (the reply's source) by an element that moved or went; never
    /// another service's flows.
    TranslatedTo(Ipv4Addr),
    /// Not translated at all (the reply's source is the original destination), which a new
    /// element would now translate.
    Untranslated,
    /// To this address, with the client's address rewritten by some rule (the reply's
    /// destination is not the original source): a new request claim would now keep it.
    Masqueraded(Ipv4Addr),
}

impl StaleFlows {
    pub(super) fn selects(&self, e: &Entry) -> bool {
        e.orig.proto == self.protocol
            && match self.path {
                StalePath::TranslatedTo(to) => self.ports.contains(&e.orig.dport) && e.reply.src == to,
                StalePath::Untranslated => self.ports.contains(&e.orig.dport) && e.reply.src == e.orig.dst,
                StalePath::Masqueraded(to) => {
                    self.ports.contains(&e.reply.sport) && e.reply.src == to && e.reply.dst != e.orig.src
                }
            }
    }
}

/// The UDP flows a table change leaves on a wrong path, which keep it as long as they send,
/// for every set flagged in `old` or `new` (`NftSet.udp_flows`):
/// - a DNAT map: those an element of `old` translated, when the element is gone from `new` or
///   now maps elsewhere; and those no element translated (their first datagram came before
///   the element), for every element `new` adds or changes. On a pod's node the link's
///   element can land after the accepting node already sends the flow there; that datagram
///   makes an untranslated entry.
/// - a request claim: for every element `new` adds, the flows to its pod whose client address
///   the CNI's masquerade rewrote. The claim lands later than the rest of a mapping when the
///   pod's node reports the pod's route after the mapping was placed; meanwhile the pod's
///   flows are masqueraded.
///
/// Only UDP, as kube-proxy does: an established UDP flow refreshes its entry with every datagram,
/// while a TCP flow to a vanished pod ends on its own and one to a live pod may still drain.
/// Sets whose digests match are skipped without a walk, and so are the equal runs at both ends
/// of a changed set; elements are in canonical order, so its common head and tail are skipped
/// too.
pub fn stale_udp(old: Option<&NftTable>, new: Option<&NftTable>) -> Vec<StaleFlows> {
    let mut out = Vec::new();
    for name in flagged(old, new) {
        let (before, after) = (set_of(old, name), set_of(new, name));
        if let (Some(b), Some(a)) = (before, after)
            && !a.digest.is_empty()
            && a.digest == b.digest
        {
            continue;
        }
        let (b, a) = (elements(before), elements(after));
        let (_, head, tail) = common_ends(b, runs(before), a, runs(after));
        let (b, a) = (&b[head..b.len() - tail], &a[head..a.len() - tail]);
        let by_key = |list: &[NftElement]| -> HashMap<String, Vec<NftValue>> {
            list.iter().map(|e| (format!("{:?}", e.key), e.data.clone())).collect()
        };
        let (was, now) = (by_key(b), by_key(a));
        let unchanged = |e: &NftElement, other: &HashMap<String, Vec<NftValue>>| {
            other.get(&format!("{:?}", e.key)).is_some_and(|data| *data == e.data)
        };
        if let Some(layout) = before.and_then(Layout::of) {
            out.extend(b.iter().filter(|e| !unchanged(e, &now)).filter_map(|e| layout.flows(e, Change::Went)));
        }
        if let Some(layout) = after.and_then(Layout::of) {
            out.extend(a.iter().filter(|e| !unchanged(e, &was)).filter_map(|e| layout.flows(e, Change::Came)));
        }
    }
    out
}

/// The names of the sets flagged in either table, in table order (old's first): a set that
/// loses or gains the flag still says what its elements did.
fn flagged<'a>(old: Option<&'a NftTable>, new: Option<&'a NftTable>) -> Vec<&'a str> {
    let mut names: Vec<&str> = Vec::new();
    for s in [old, new].into_iter().flatten().flat_map(|t| &t.sets) {
        if s.udp_flows() != UdpFlows::Kept && !names.contains(&s.name.as_str()) {
            names.push(&s.name);
        }
    }
    names
}

fn set_of<'a>(table: Option<&'a NftTable>, name: &str) -> Option<&'a NftSet> {
    table.and_then(|t| t.sets.iter().find(|s| s.name == name))
}

fn elements(set: Option<&NftSet>) -> &[NftElement] {
    set.map_or(&[][..], |s| &s.elements[..])
}

fn runs(set: Option<&NftSet>) -> &[ElementRun] {
    set.map_or(&[][..], |s| &s.runs[..])
}

/// What happened to an element: it went from the old set (or changed), or came to the new one.
#[derive(Clone, Copy)]
enum Change {
    Went,
    Came,
}

/// What a flagged set holds, and where its elements hold the protocol and the port (key) and
/// the address: a DNAT map's target (data), a claim's pod (key).
struct Layout {
    kind: UdpFlows,
    protocol: usize,
    port: usize,
    address: usize,
}

impl Layout {
    /// None for a set not flagged, or whose types lack one of them (it holds nothing conntrack
    /// can name).
    fn of(set: &NftSet) -> Option<Self> {
        let at = |types: &[i32], ty: NftType| types.iter().position(|t| *t == ty as i32);
        let kind = set.udp_flows();
        let address = match kind {
            UdpFlows::Kept => return None,
            UdpFlows::Dnat => at(&set.data, NftType::Ipv4Addr)?,
            UdpFlows::Claim => at(&set.key, NftType::Ipv4Addr)?,
        };
        Some(Layout {
            kind,
            protocol: at(&set.key, NftType::InetProto)?,
            port: at(&set.key, NftType::InetService)?,
            address,
        })
    }

    /// The UDP flows an element's change leaves on a wrong path, if any.
    fn flows(&self, e: &NftElement, change: Change) -> Option<StaleFlows> {
        fn value(list: &[NftValue], i: usize) -> Option<&Value> {
            list.get(i).and_then(|v| v.value.as_ref())
        }
        let Some(Value::Proto(p)) = value(&e.key, self.protocol) else { return None };
        let Some(Value::Port(r)) = value(&e.key, self.port) else { return None };
        let in_data = self.kind == UdpFlows::Dnat;
        let Some(Value::Addr(a)) = value(if in_data { &e.data } else { &e.key }, self.address) else { return None };
        let protocol = u8::try_from(*p).ok().filter(|p| *p == UDP)?;
        let ports = u16::try_from(r.first).ok()?..=u16::try_from(r.last).ok()?;
        let address: Ipv4Addr = a.parse().ok()?;
        let path = match (self.kind, change) {
            (UdpFlows::Dnat, Change::Went) => StalePath::TranslatedTo(address),
            (UdpFlows::Dnat, Change::Came) => StalePath::Untranslated,
            (UdpFlows::Claim, Change::Came) => StalePath::Masqueraded(address),
            // A claim that goes leaves its flows claimed: their client address is still right.
            (UdpFlows::Claim, Change::Went) | (UdpFlows::Kept, _) => return None,
        };
        Some(StaleFlows { protocol, ports, path })
    }
}

#[cfg(test)]
mod tests {
    use kuport_proto::owned;
    use kuport_proto::v1::PortRange;

    use super::super::codec::tests::entry;
    use super::*;

    #[test]
    fn flows_select_by_protocol_port_and_old_target() {
        let old = Ipv4Addr::new(10, 0, 1, 2);
        let flows = StaleFlows { protocol: 17, ports: 27000..=27015, path: StalePath::TranslatedTo(old) };
        assert!(flows.selects(&entry(27015, old.octets())));
        assert!(flows.selects(&entry(27000, old.octets())));
        assert!(!flows.selects(&entry(27015, [10, 0, 1, 3])), "another target's flow");
        assert!(!flows.selects(&entry(27016, old.octets())), "a port outside the range");
        assert!(!StaleFlows { protocol: 6, ..flows }.selects(&entry(27015, old.octets())), "another protocol");
    }

    fn v(value: Value) -> NftValue {
        NftValue { value: Some(value) }
    }

    /// A publish_port element: (ifname, proto, port) to (target, port).
    fn published(proto: i32, port: u32, target: &str) -> NftElement {
        let ports = PortRange { first: port, last: port };
        NftElement {
            key: vec![v(Value::Ifname("eth1".into())), v(Value::Proto(proto)), v(Value::Port(ports))],
            data: vec![v(Value::Addr(target.into())), v(Value::Port(ports))],
        }
    }

    /// A table with a publish_port map flagged for flushing.
    fn table(elements: Vec<NftElement>) -> NftTable {
        let types = |list: &[NftType]| list.iter().map(|t| *t as i32).collect();
        let mut set = NftSet {
            name: owned::MAP_PUBLISH_PORT.into(),
            key: types(&[NftType::Ifname, NftType::InetProto, NftType::InetService]),
            data: types(&[NftType::Ipv4Addr, NftType::InetService]),
            udp_flows: UdpFlows::Dnat as i32,
            elements: elements.into(),
            ..Default::default()
        };
        (set.runs, set.digest) = kuport_proto::canonical::element_runs(&set.elements);
        NftTable { name: owned::NFT_TABLE.into(), sets: vec![set].into(), ..Default::default() }
    }

    #[test]
    fn moved_removed_and_added_udp_elements_leave_stale_flows() {
        let old =
            table(vec![published(6, 80, "10.0.0.1"), published(17, 5000, "10.0.0.2"), published(17, 6000, "10.0.0.3")]);
        // Unchanged: nothing, whether or not digests are there.
        assert!(stale_udp(Some(&old), Some(&old)).is_empty());
        let mut undigested = old.clone();
        undigested.sets[0].digest.clear();
        assert!(stale_udp(Some(&undigested), Some(&undigested)).is_empty());

        // 5000 moves, 6000 goes, 7000 comes, TCP 80 moves too (TCP is left alone).
        let new =
            table(vec![published(6, 80, "10.0.0.9"), published(17, 5000, "10.0.0.8"), published(17, 7000, "10.0.0.7")]);
        let flows = |list: &[(u16, Option<&str>)]| -> Vec<StaleFlows> {
            list.iter()
                .map(|(p, t)| StaleFlows {
                    protocol: UDP,
                    ports: *p..=*p,
                    path: t
                        .map_or(StalePath::Untranslated, |t| StalePath::TranslatedTo(t.parse().expect("an address"))),
                })
                .collect()
        };
        // The old targets' flows, then the untranslated flows of what the new elements catch.
        let want = flows(&[(5000, Some("10.0.0.2")), (6000, Some("10.0.0.3")), (5000, None), (7000, None)]);
        assert_eq!(stale_udp(Some(&old), Some(&new)), want);
        // The table gone: every UDP element's flows; the first table: its untranslated ones.
        assert_eq!(stale_udp(Some(&old), None), flows(&[(5000, Some("10.0.0.2")), (6000, Some("10.0.0.3"))]));
        assert_eq!(stale_udp(None, Some(&old)), flows(&[(5000, None), (6000, None)]));
    }

    #[test]
    fn runs_skip_the_unchanged_ends_of_a_large_map_and_find_the_same_flows() {
        let many = |skip: u32, moved: u32| {
            let target = |p: u32| if p == moved { "10.0.9.9" } else { "10.0.0.1" };
            table((1..=20_000).filter(|p| *p != skip).map(|p| published(17, p, target(p))).collect())
        };
        let (old, new) = (many(10_001, 0), many(0, 15_000));
        assert!(old.sets[0].runs.len() > 20);
        let mut plain = (old.clone(), new.clone());
        for s in [&mut plain.0.sets[0], &mut plain.1.sets[0]] {
            (s.runs, s.digest) = (Vec::new(), Vec::new());
        }
        let want = stale_udp(Some(&plain.0), Some(&plain.1));
        assert_eq!(want.len(), 3, "{want:?}");
        assert_eq!(stale_udp(Some(&old), Some(&new)), want);
    }

    #[test]
    fn untranslated_flows_are_selected_by_port_only_when_nothing_translated_them() {
        let flows = StaleFlows { protocol: 17, ports: 27015..=27115, path: StalePath::Untranslated };
        let mut e = entry(27015, [203, 0, 113, 9]);
        e.orig.dst = Ipv4Addr::new(203, 0, 113, 9);
        assert!(flows.selects(&e), "reply source = original destination: untranslated");
        e.reply.src = Ipv4Addr::new(10, 0, 1, 2);
        assert!(!flows.selects(&e), "translated by something else");
    }

    #[test]
    fn masqueraded_flows_are_selected_by_the_servers_port_and_address() {
        let pod = Ipv4Addr::new(10, 244, 1, 7);
        let flows = StaleFlows { protocol: 17, ports: 27015..=27015, path: StalePath::Masqueraded(pod) };
        // Through a link: the original destination and port are the link's, the reply's the pod's.
        let mut e = entry(4789, pod.octets());
        e.reply.sport = 27015;
        assert!(!flows.selects(&e), "the client's address kept: claimed already");
        e.reply.dst = Ipv4Addr::new(10, 244, 1, 1);
        assert!(flows.selects(&e), "the client's address rewritten");
        e.reply.sport = 27016;
        assert!(!flows.selects(&e), "another port of the pod");
        e.reply.sport = 27015;
        e.reply.src = Ipv4Addr::new(10, 244, 1, 8);
        assert!(!flows.selects(&e), "another pod");
    }

    /// A claim_port element: (ifname, pod, proto, port), no data.
    fn claim(pod: &str, port: u32) -> NftElement {
        let ports = PortRange { first: port, last: port };
        NftElement {
            key: vec![
                v(Value::Ifname("cilium_host".into())),
                v(Value::Addr(pod.into())),
                v(Value::Proto(17)),
                v(Value::Port(ports)),
            ],
            data: vec![],
        }
    }

    fn claims(elements: Vec<NftElement>) -> NftTable {
        let types = |list: &[NftType]| list.iter().map(|t| *t as i32).collect();
        let mut set = NftSet {
            name: "claim_port".into(),
            key: types(&[NftType::Ifname, NftType::Ipv4Addr, NftType::InetProto, NftType::InetService]),
            udp_flows: UdpFlows::Claim as i32,
            elements: elements.into(),
            ..Default::default()
        };
        (set.runs, set.digest) = kuport_proto::canonical::element_runs(&set.elements);
        NftTable { name: owned::NFT_TABLE.into(), sets: vec![set].into(), ..Default::default() }
    }

    #[test]
    fn a_claim_that_comes_frees_its_pods_masqueraded_flows_and_one_that_goes_nothing() {
        let masqueraded = |pod: &str, port: u16| StaleFlows {
            protocol: UDP,
            ports: port..=port,
            path: StalePath::Masqueraded(pod.parse().expect("an address")),
        };
        let old = claims(vec![claim("10.244.1.5", 5000)]);
        let new = claims(vec![claim("10.244.1.5", 5000), claim("10.244.1.7", 27015)]);
        assert_eq!(stale_udp(Some(&old), Some(&new)), [masqueraded("10.244.1.7", 27015)]);
        assert_eq!(stale_udp(None, Some(&old)), [masqueraded("10.244.1.5", 5000)]);
        assert!(stale_udp(Some(&new), Some(&old)).is_empty(), "a claim gone");
        assert!(stale_udp(Some(&new), None).is_empty(), "the table gone");
        // Not flagged: nothing.
        let mut kept = new.clone();
        kept.sets[0].udp_flows = UdpFlows::Kept as i32;
        assert!(stale_udp(Some(&old), Some(&kept)).is_empty());
    }
}
