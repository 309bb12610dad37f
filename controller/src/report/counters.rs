//! A node's kernel counters attributed to the PortMaps it publishes (docs/operations/counters.md):
//! what `kuportctl portmap` shows and the per-mapping metrics export.
//!
//! The executor reports counters by element key and rule position only; which mapping each
//! belongs to is decided here, from what the controller itself computed. A counter counts only
//! where the node's desired state has the set or chain and the element's interface, protocol
//! and port name a mapping this node publishes: a node can misreport its own numbers, never
//! claim another node's mapping.

use std::collections::{BTreeMap, HashMap};

use kuport_proto::v1::{
    CounterReport, L4Proto, NftChain, NftRule, NftSet, NftTable, NftType, NodeState, Verdict, VerdictKind,
    nft_statement, nft_value::Value, set_update,
};

use crate::api::{PortMap, PortMapStatus, Protocol};
use crate::compute::portmap::MapKey;
use crate::compute::portmap::admission::key_of;

/// One mapping's counters on one accepting node, summed over its interfaces and families.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MapCounters {
    /// Packets that passed every check and were steered to the mapping (the steering maps).
    pub accepted_packets: u64,
    pub accepted_bytes: u64,
    /// New connections translated to the mapping's target (the DNAT maps: NAT sees only a
    /// connection's first packet).
    pub connections: u64,
    /// Packets dropped for a source outside the allow-list (the guard chain's last rule).
    pub dropped_source: u64,
    /// New connections dropped beyond the per-source rate.
    pub dropped_rate: u64,
    /// New connections dropped beyond the per-source connection cap.
    pub dropped_connections: u64,
}

/// What a node's counter may name: the mappings each node publishes, by node, then interface,
/// protocol and first port (unique: admission refuses overlaps on a node's interface). Nested so
/// that a lookup borrows the report's names.
#[derive(Debug, Default)]
pub struct Owners(HashMap<String, ByInterface>);

/// One node's mappings: by interface, then protocol and first port.
type ByInterface = HashMap<String, HashMap<(L4Proto, u16), MapKey>>;

impl Owners {
    /// The mappings every node publishes, from their computed statuses.
    pub fn new<'a>(
        port_maps: impl IntoIterator<Item = &'a PortMap>,
        statuses: &crate::compute::Shared<MapKey, PortMapStatus>,
    ) -> Self {
        let mut owners: HashMap<String, ByInterface> = HashMap::new();
        for pm in port_maps {
            let key = key_of(pm);
            let Some(status) = statuses.get(&key) else { continue };
            let proto = match pm.spec.protocol {
                Protocol::Tcp => L4Proto::Tcp,
                Protocol::Udp => L4Proto::Udp,
            };
            for p in &status.published {
                let on_iface = owners.entry(p.node.clone()).or_default().entry(p.interface.clone()).or_default();
                on_iface.insert((proto, pm.spec.port), key.clone());
            }
        }
        Owners(owners)
    }

    /// The mapping of `node` an element's key names: its interface, protocol and (first) port.
    fn of_key(&self, node: &str, key: &[kuport_proto::v1::NftValue]) -> Option<&MapKey> {
        let (mut iface, mut proto, mut port) = (None, None, None);
        for v in key {
            match &v.value {
                Some(Value::Ifname(i)) => iface = Some(i.as_str()),
                Some(Value::Proto(p)) => proto = L4Proto::try_from(*p).ok(),
                Some(Value::Port(r)) => port = u16::try_from(r.first).ok(),
                _ => {}
            }
        }
        self.0.get(node)?.get(iface?)?.get(&(proto?, port?))
    }
}

/// What a counted rule of a mapping's own chain drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drops {
    Source,
    Rate,
    Connections,
}

/// A mapping's own rule: what it drops, by what it does (docs/portmap/guard.md).
fn drops(rule: &NftRule) -> Drops {
    let stateful = rule.statements.iter().find_map(|s| match &s.kind {
        Some(nft_statement::Kind::SetUpdate(u)) => u.stateful.as_ref(),
        _ => None,
    });
    match stateful {
        Some(set_update::Stateful::Limit(_)) => Drops::Rate,
        Some(set_update::Stateful::CtCount(_)) => Drops::Connections,
        None => Drops::Source,
    }
}

/// Attributes `node`'s `report` to the mappings `owners` says it publishes, reading `state`
/// (its desired state) for which set and chain is which. Returns the counters by mapping, and how many
/// reported counters named nothing the node publishes (left out).
pub fn attribute(
    node: &str,
    state: &NodeState,
    report: &CounterReport,
    owners: &Owners,
) -> (BTreeMap<MapKey, MapCounters>, usize) {
    let mut out: BTreeMap<MapKey, MapCounters> = BTreeMap::new();
    let mut unknown = 0;
    let host: Vec<&NftTable> = state.netns.iter().filter(|n| n.is_host()).flat_map(|n| &n.nft_tables).collect();
    for t in &report.tables {
        let Some(want) = host.iter().find(|w| w.family == t.family && w.name == t.name) else {
            unknown += t.sets.iter().map(|s| s.elements.len()).sum::<usize>();
            continue;
        };
        let sets: HashMap<&str, &NftSet> = want.sets.iter().map(|s| (s.name.as_str(), s)).collect();
        for s in &t.sets {
            let kind = sets.get(s.name.as_str()).filter(|w| w.counter).and_then(|_| set_kind(&s.name));
            for e in &s.elements {
                let Some((kind, owner)) = kind.zip(owners.of_key(node, &e.key)) else {
                    unknown += 1;
                    continue;
                };
                let c = out.entry(owner.clone()).or_default();
                match kind {
                    SetKind::Steer => {
                        c.accepted_packets += e.packets;
                        c.accepted_bytes += e.bytes;
                    }
                    SetKind::Publish => c.connections += e.packets,
                }
            }
        }
        let chains = own_chains(node, want, owners);
        for c in &t.chains {
            let Some((chain, owner)) = chains.get(c.name.as_str()) else {
                unknown += c.rules.len();
                continue;
            };
            for r in &c.rules {
                let Some(rule) = usize::try_from(r.index).ok().and_then(|i| chain.rules.get(i)) else {
                    unknown += 1;
                    continue;
                };
                let m = out.entry((*owner).clone()).or_default();
                match drops(rule) {
                    Drops::Source => m.dropped_source += r.packets,
                    Drops::Rate => m.dropped_rate += r.packets,
                    Drops::Connections => m.dropped_connections += r.packets,
                }
            }
        }
    }
    (out, unknown)
}

#[derive(Debug, Clone, Copy)]
enum SetKind {
    Steer,
    Publish,
}

/// The counted sets of the port-map table by what they count (docs/portmap/datapath.md).
fn set_kind(name: &str) -> Option<SetKind> {
    if name.starts_with("steer_") {
        Some(SetKind::Steer)
    } else if name.starts_with("publish_") {
        Some(SetKind::Publish)
    } else {
        None
    }
}

/// The chains only one mapping's packets reach: those its verdict-map elements jump to, and
/// those these chains go on to (a guard chain's admitted packets go to the limit chain).
fn own_chains<'a>(node: &str, table: &'a NftTable, owners: &'a Owners) -> HashMap<&'a str, (&'a NftChain, &'a MapKey)> {
    let chains: HashMap<&str, &NftChain> = table.chains.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut out = HashMap::new();
    let mut next = Vec::new();
    for s in table.sets.iter().filter(|s| s.data == [NftType::Verdict as i32]) {
        for e in &s.elements {
            let Some(owner) = owners.of_key(node, &e.key) else { continue };
            for d in &e.data {
                if let Some(Value::Verdict(v)) = &d.value
                    && let Some(chain) = target(v, &chains)
                    && out.insert(v.chain.as_str(), (chain, owner)).is_none()
                {
                    next.push(chain);
                }
            }
        }
    }
    while let Some(from) = next.pop() {
        let Some(&(_, owner)) = out.get(from.name.as_str()) else { continue };
        for s in from.rules.iter().flat_map(|r| &r.statements) {
            if let Some(nft_statement::Kind::Verdict(v)) = &s.kind
                && let Some(chain) = target(v, &chains)
                && !out.contains_key(v.chain.as_str())
            {
                out.insert(v.chain.as_str(), (chain, owner));
                next.push(chain);
            }
        }
    }
    out
}

/// The chain a jump or goto names, when the table has it.
fn target<'a>(v: &Verdict, chains: &HashMap<&str, &'a NftChain>) -> Option<&'a NftChain> {
    let leaves = matches!(VerdictKind::try_from(v.kind), Ok(VerdictKind::Jump | VerdictKind::Goto));
    leaves.then(|| chains.get(v.chain.as_str()).copied()).flatten()
}

#[cfg(test)]
mod tests {
    use kuport_proto::v1::{ChainCounters, ElementCount, NftValue, RuleCount, SetCounters, TableCounters};

    use super::*;
    use crate::compute::testkit::scenarios;

    /// The rate-limited golden world: edge-a publishes web (TCP 3000 on enp1s0 and wt0, IPv6 on
    /// enp1s0, rate and connection bounds) and game (UDP 27015-27115 on both, a rate and an
    /// allow-list).
    fn world() -> (NodeState, Owners) {
        let world = scenarios().into_iter().find(|(n, _)| *n == "rate_limited_dual_stack").expect("scenario").1;
        let out = world.run();
        let cluster = world.cluster();
        (NodeState::clone(&out.node_states["edge-a"]), Owners::new(&cluster.port_maps, &out.port_maps))
    }

    /// Every counted element and every counted rule of `state`'s host tables at one packet.
    fn all_at_one(state: &NodeState) -> CounterReport {
        let mut tables = Vec::new();
        for t in state.netns.iter().filter(|n| n.is_host()).flat_map(|n| &n.nft_tables) {
            let sets = t
                .sets
                .iter()
                .filter(|s| s.counter)
                .map(|s| SetCounters {
                    name: s.name.clone(),
                    elements: s
                        .elements
                        .iter()
                        .map(|e| ElementCount { key: e.key.clone(), packets: 1, bytes: 100 })
                        .collect(),
                })
                .collect();
            let counted =
                |r: &NftRule| r.statements.iter().any(|s| matches!(s.kind, Some(nft_statement::Kind::Counter(_))));
            let chains = t
                .chains
                .iter()
                .map(|c| ChainCounters {
                    name: c.name.clone(),
                    rules: (0u32..)
                        .zip(&c.rules)
                        .filter(|(_, r)| counted(r))
                        .map(|(index, _)| RuleCount { index, packets: 1, bytes: 100 })
                        .collect(),
                })
                .filter(|c| !c.rules.is_empty())
                .collect();
            tables.push(TableCounters { family: t.family, name: t.name.clone(), sets, chains });
        }
        CounterReport { id: 1, tables, ..Default::default() }
    }

    #[test]
    fn each_counter_goes_to_the_mapping_whose_element_or_chain_it_is() {
        let (state, owners) = world();
        let (by_map, _) = attribute("edge-a", &state, &all_at_one(&state), &owners);
        let web = by_map[&("web".to_string(), "web".to_string())];
        // Three steering and three DNAT elements (enp1s0 and wt0 over IPv4, enp1s0 over IPv6),
        // and three limit chains each with a rate and a connection rule.
        assert_eq!(
            web,
            MapCounters {
                accepted_packets: 3,
                accepted_bytes: 300,
                connections: 3,
                dropped_source: 0,
                dropped_rate: 3,
                dropped_connections: 3
            }
        );
        let game = by_map[&("games".to_string(), "game".to_string())];
        // IPv4 only, on both interfaces: its allow-list's drop and its rate, each twice.
        assert_eq!(
            game,
            MapCounters {
                accepted_packets: 2,
                accepted_bytes: 200,
                connections: 2,
                dropped_source: 2,
                dropped_rate: 2,
                dropped_connections: 0
            }
        );
        assert_eq!(by_map.len(), 2);
    }

    /// The attack: a node reports counters for what it does not publish (another interface or
    /// port, a set or chain of no mapping, a table it was never given), or reports another
    /// node's mappings. None is counted.
    #[test]
    fn counters_a_node_does_not_publish_are_left_out() {
        let (state, owners) = world();
        let el = |iface: &str, port: u32| ElementCount {
            key: vec![
                NftValue { value: Some(Value::Ifname(iface.into())) },
                NftValue { value: Some(Value::Addr("203.0.113.9".into())) },
                NftValue { value: Some(Value::Proto(L4Proto::Tcp as i32)) },
                NftValue { value: Some(Value::Port(kuport_proto::v1::PortRange { first: port, last: port })) },
            ],
            packets: 1_000,
            bytes: 1_000,
        };
        let kuport = &state.netns.iter().find(|n| n.is_host()).expect("host").nft_tables[0];
        let forged = CounterReport {
            id: 1,
            tables: vec![
                TableCounters {
                    family: kuport.family,
                    name: kuport.name.clone(),
                    sets: vec![
                        SetCounters { name: "steer_port".into(), elements: vec![el("enp1s0", 3001), el("eth9", 3000)] },
                        SetCounters { name: "steer_bogus".into(), elements: vec![el("enp1s0", 3000)] },
                    ],
                    chains: vec![
                        ChainCounters {
                            name: "kup-steer".into(),
                            rules: vec![RuleCount { index: 0, packets: 9, bytes: 9 }],
                        },
                        ChainCounters {
                            name: "kup-limit-bb8".into(),
                            rules: vec![RuleCount { index: 7, packets: 9, bytes: 9 }],
                        },
                    ],
                },
                TableCounters {
                    family: kuport.family,
                    name: "elsewhere".into(),
                    sets: vec![SetCounters { name: "steer_port".into(), elements: vec![el("enp1s0", 3000)] }],
                    chains: vec![],
                },
            ],
            ..Default::default()
        };
        assert_eq!(attribute("edge-a", &state, &forged, &owners), (BTreeMap::new(), 6));
        // worker-c holds web's pod but publishes nothing: edge-a's counters, reported as its
        // own, name nothing of it.
        let (by_map, _) = attribute("worker-c", &state, &all_at_one(&state), &owners);
        assert_eq!(by_map, BTreeMap::new());
    }
}
