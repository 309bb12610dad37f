//! Which conntrack entries a change of the DNAT maps leaves on the wrong path. The state says
//! which maps those are (`NftSet.flush_udp_flows`), and each map's key and data types say where
//! its protocol, port and target address sit.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

use kuport_proto::canonical::common_ends;
use kuport_proto::v1::nft_value::Value;
use kuport_proto::v1::{ElementRun, NftElement, NftSet, NftTable, NftType, NftValue};

use super::codec::Entry;

/// IPPROTO_UDP.
const UDP: u8 = 17;

/// Which conntrack entries to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleFlows {
    /// IPPROTO_TCP (6) or IPPROTO_UDP (17); entries without ports never match.
    pub protocol: u8,
    /// Original-direction destination ports, inclusive.
    pub ports: RangeInclusive<u16>,
    /// Some: entries translated to this address (their reply source), by an element that moved
    /// or went; never another service's flows. None: entries not translated at all (reply source
    /// = original destination), which a new element would now translate.
    pub translated_to: Option<Ipv4Addr>,
}

impl StaleFlows {
    pub(super) fn selects(&self, e: &Entry) -> bool {
        e.orig.proto == self.protocol
            && self.ports.contains(&e.orig.dport)
            && e.reply_src == self.translated_to.unwrap_or(e.orig.dst)
    }
}

/// The UDP flows a table change leaves on the wrong path, which keep it as long as they send,
/// for every map flagged `flush_udp_flows` in `old` or `new`:
/// - those an element of `old` translated, when the element is gone from `new` or now maps
///   elsewhere;
/// - those no element translated (their first datagram came before the element), for every
///   element `new` adds or changes. On a pod's node the link's element can land after the
///   accepting node already sends the flow there; that datagram makes an untranslated entry.
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
            out.extend(b.iter().filter(|e| !unchanged(e, &now)).filter_map(|e| layout.flows(e, true)));
        }
        if let Some(layout) = after.and_then(Layout::of) {
            out.extend(a.iter().filter(|e| !unchanged(e, &was)).filter_map(|e| layout.flows(e, false)));
        }
    }
    out
}

/// The names of the sets flagged in either table, in table order (old's first): a map that
/// loses or gains the flag still says what its elements translated.
fn flagged<'a>(old: Option<&'a NftTable>, new: Option<&'a NftTable>) -> Vec<&'a str> {
    let mut names: Vec<&str> = Vec::new();
    for s in [old, new].into_iter().flatten().flat_map(|t| &t.sets) {
        if s.flush_udp_flows && !names.contains(&s.name.as_str()) {
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

/// Where a DNAT map's elements hold the protocol and the port (key) and the target (data).
struct Layout {
    protocol: usize,
    port: usize,
    target: usize,
}

impl Layout {
    /// None for a map whose types lack one of them (it translates nothing conntrack can name).
    fn of(set: &NftSet) -> Option<Self> {
        let at = |types: &[i32], ty: NftType| types.iter().position(|t| *t == ty as i32);
        Some(Layout {
            protocol: at(&set.key, NftType::InetProto)?,
            port: at(&set.key, NftType::InetService)?,
            target: at(&set.data, NftType::Ipv4Addr)?,
        })
    }

    /// The UDP flows of one element: its ports, and its target (`translated`) or none.
    fn flows(&self, e: &NftElement, translated: bool) -> Option<StaleFlows> {
        fn value(list: &[NftValue], i: usize) -> Option<&Value> {
            list.get(i).and_then(|v| v.value.as_ref())
        }
        let Some(Value::Proto(p)) = value(&e.key, self.protocol) else { return None };
        let Some(Value::Port(r)) = value(&e.key, self.port) else { return None };
        let Some(Value::Addr(a)) = value(&e.data, self.target) else { return None };
        let protocol = u8::try_from(*p).ok().filter(|p| *p == UDP)?;
        let ports = u16::try_from(r.first).ok()?..=u16::try_from(r.last).ok()?;
        let target: Ipv4Addr = a.parse().ok()?;
        Some(StaleFlows { protocol, ports, translated_to: translated.then_some(target) })
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
        let flows = StaleFlows { protocol: 17, ports: 27000..=27015, translated_to: Some(old) };
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
            flush_udp_flows: true,
            elements,
            ..Default::default()
        };
        (set.runs, set.digest) = kuport_proto::canonical::element_runs(&set.elements);
        NftTable { name: owned::NFT_TABLE.into(), sets: vec![set], ..Default::default() }
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
                    translated_to: t.map(|t| t.parse().expect("an address")),
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
        let flows = StaleFlows { protocol: 17, ports: 27015..=27115, translated_to: None };
        let mut e = entry(27015, [203, 0, 113, 9]);
        e.orig.dst = Ipv4Addr::new(203, 0, 113, 9);
        assert!(flows.selects(&e), "reply source = original destination: untranslated");
        e.reply_src = Ipv4Addr::new(10, 0, 1, 2);
        assert!(!flows.selects(&e), "translated by something else");
    }
}
