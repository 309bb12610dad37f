use proptest::prelude::*;

use super::*;
use crate::build::{accept, addr, chain, counter, member, port, rule, set, table};
use crate::canonical::canonicalize_netns_whole;
use crate::v1::{NftFamily, NftSet, NftType, Route, Sysctl, WireguardPeer};

/// A namespace drawn from small pools, so that two draws share most of their items: sysctls,
/// routes, one table whose set holds some of 600 ports (and, with `other_chain`, a second
/// chain), one WireGuard device with some of 30 peers at one of two endpoints each.
#[derive(Clone, Debug)]
struct Shape {
    sysctls: Vec<bool>,
    routes: Vec<bool>,
    ports: Vec<bool>,
    other_chain: bool,
    /// A second set; and the ports set counted (its declaration changes).
    other_set: bool,
    counted: bool,
    peers: Vec<Option<bool>>,
    mtu: u32,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop::collection::vec(any::<bool>(), 4),
        prop::collection::vec(any::<bool>(), 12),
        // 600 ports: a set of about four runs.
        prop::collection::vec(any::<bool>(), 600),
        (any::<bool>(), any::<bool>(), any::<bool>()),
        prop::collection::vec(prop::option::of(any::<bool>()), 30),
        prop_oneof![Just(1420u32), Just(1380)],
    )
        .prop_map(|(sysctls, routes, ports, (other_chain, other_set, counted), peers, mtu)| Shape {
            sysctls,
            routes,
            ports,
            other_chain,
            other_set,
            counted,
            peers,
            mtu,
        })
}

fn peer(i: usize, second: bool) -> WireguardPeer {
    WireguardPeer {
        public_key: format!("key-{i:02}"),
        endpoint: format!("192.0.2.{}:{}", i, if second { 40000 } else { 51820 }),
        allowed_ips: vec![format!("10.42.{i}.0/24")],
        persistent_keepalive_seconds: 25,
        probe_address: format!("10.42.{i}.0"),
    }
}

fn namespace(s: &Shape) -> NetnsState {
    let on = |v: &[bool]| v.iter().enumerate().filter(|(_, b)| **b).map(|(i, _)| i).collect::<Vec<_>>();
    let elements = on(&s.ports).into_iter().map(|p| member(vec![port(1000 + p as u32)])).collect();
    let mut chains = vec![chain("a", vec![rule(vec![], vec![counter(), accept()])])];
    if s.other_chain {
        chains.push(chain("b", vec![rule(vec![], vec![accept()])]));
    }
    let mut sets = vec![NftSet { counter: s.counted, ..set("ports", &[NftType::InetService], &[], elements) }];
    if s.other_set {
        sets.push(set("more", &[NftType::InetService], &[], vec![member(vec![port(9)])]));
    }
    let mut ns = NetnsState {
        sysctls: on(&s.sysctls).into_iter().map(|i| Sysctl { key: format!("k{i}"), value: "1".into() }).collect(),
        routes: on(&s.routes)
            .into_iter()
            .map(|i| Route { table: 254, dst: format!("10.42.{i}.0/24"), via: String::new(), dev: "kup-wg".into() })
            .collect(),
        nft_tables: vec![table(NftFamily::Inet, "kuport", sets, chains)].into(),
        wireguard_devices: vec![WireguardDevice {
            name: "kup-wg".into(),
            mtu: s.mtu,
            listen_port: 51820,
            fwmark: 0,
            peers: s.peers.iter().enumerate().filter_map(|(i, p)| Some(peer(i, (*p)?))).collect(),
        }],
        ..Default::default()
    };
    canonicalize_netns_whole(&mut ns);
    ns
}

proptest! {
    /// Whatever two namespaces are, the delta from one gives the other, version and all.
    #[test]
    fn a_delta_gives_the_new_namespace(a in shape(), b in shape()) {
        let (old, new) = (namespace(&a), namespace(&b));
        let sent = diff(&old, &new);
        prop_assert_eq!(apply(&old, sent.clone()), Ok(new));
    }
}

#[test]
fn one_peer_changed_among_a_thousand_is_a_delta_of_one_peer() {
    let big = |second: usize| {
        let mut ns = NetnsState {
            wireguard_devices: vec![WireguardDevice {
                name: "kup-wg".into(),
                peers: (0..1000).map(|i| peer(i, i == second)).collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
        canonicalize_netns_whole(&mut ns);
        ns
    };
    let (old, new) = (big(usize::MAX), big(7));
    let sent = diff(&old, &new);
    let d = sent.delta.as_ref().expect("a delta");
    assert_eq!(d.peers.len(), 1);
    assert_eq!(d.peers[0].put, vec![peer(7, true)]);
    assert!(d.peers[0].removed.is_empty());
    assert!(sent.encoded_len() < 1024, "{} bytes, whole {}", sent.encoded_len(), new.encoded_len());
    assert_eq!(apply(&old, sent.clone()), Ok(new));
}

#[test]
fn a_delta_refuses_another_base_and_a_result_of_another_version() {
    let s = |mtu, port: bool| Shape {
        sysctls: vec![true; 4],
        routes: vec![true; 12],
        ports: vec![port; 40],
        other_chain: false,
        other_set: false,
        counted: false,
        peers: vec![Some(false); 30],
        mtu,
    };
    let (old, new) = (namespace(&s(1420, false)), namespace(&s(1420, true)));
    let sent = diff(&old, &new);
    let other = namespace(&s(1380, false));
    assert!(matches!(apply(&other, sent.clone()), Err(DeltaError::Base { .. })));
    // A delta that does not give what its version names is refused, not applied.
    let mut forged = sent.clone();
    let d = forged.delta.as_mut().expect("a delta");
    d.added.get_or_insert_default().routes.push(Route { table: 254, dst: "0.0.0.0/0".into(), ..Default::default() });
    assert!(matches!(apply(&old, forged.clone()), Err(DeltaError::Mismatch { .. })));
    // So is one that removes what is not there.
    let mut forged = sent;
    let d = forged.delta.as_mut().expect("a delta");
    d.tables[0].sets[0].removed.push(member(vec![addr("192.0.2.1")]));
    assert!(matches!(apply(&old, forged.clone()), Err(DeltaError::Missing(_))));
}
