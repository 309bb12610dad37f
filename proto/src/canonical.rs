//! The canonical order of a node state, and its version.
//!
//! Two controllers that compute the same state must send the same bytes, so that an executor can
//! compare versions instead of states. Every repeated field whose order carries no meaning is
//! sorted here; rule order inside a chain carries meaning and is kept.

use std::net::IpAddr;

use prost::Message;
use sha2::{Digest, Sha256};

use crate::v1::{NetnsState, NftElement, NftValue, NodeState, nft_value};

/// Sorts every order-free list in `state` into its canonical order.
pub fn canonicalize(state: &mut NodeState) {
    state.netns.sort_by(|a, b| a.path.cmp(&b.path));
    for ns in &mut state.netns {
        canonicalize_netns(ns);
    }
}

fn canonicalize_netns(ns: &mut NetnsState) {
    ns.sysctls.sort_by(|a, b| a.key.cmp(&b.key));
    ns.sysctls.dedup_by(|a, b| a.key == b.key);
    ns.nft_tables.sort_by(|a, b| (a.family, &a.name).cmp(&(b.family, &b.name)));
    for table in &mut ns.nft_tables {
        table.sets.sort_by(|a, b| a.name.cmp(&b.name));
        table.chains.sort_by(|a, b| a.name.cmp(&b.name));
        for set in &mut table.sets {
            set.elements.sort_by_cached_key(element_order);
            set.elements.dedup();
        }
    }
    ns.links.sort_by(|a, b| a.name.cmp(&b.name));
    ns.addresses.sort_by(|a, b| (&a.dev, &a.cidr).cmp(&(&b.dev, &b.cidr)));
    ns.addresses.dedup();
    ns.routes.sort_by(|a, b| (a.table, &a.dst, &a.dev).cmp(&(b.table, &b.dst, &b.dev)));
    ns.routes.dedup();
    ns.ip_rules.sort_by(|a, b| {
        (a.pref, a.fwmark, a.fwmask, &a.to, a.table).cmp(&(b.pref, b.fwmark, b.fwmask, &b.to, b.table))
    });
    ns.ip_rules.dedup();
}

/// Orders elements the way a reader expects: addresses and ports numerically, not as text.
fn element_order(e: &NftElement) -> Vec<(u8, u128, u32, String)> {
    e.key.iter().chain(&e.data).map(value_order).collect()
}

fn value_order(v: &NftValue) -> (u8, u128, u32, String) {
    match &v.value {
        None => (0, 0, 0, String::new()),
        Some(nft_value::Value::Ifname(s)) => (1, 0, 0, s.clone()),
        Some(nft_value::Value::Addr(s)) => {
            let (addr, len) = s.split_once('/').unwrap_or((s.as_str(), ""));
            let n = match addr.parse::<IpAddr>() {
                Ok(IpAddr::V4(a)) => u128::from(u32::from(a)),
                Ok(IpAddr::V6(a)) => u128::from(a),
                Err(_) => u128::MAX,
            };
            (2, n, len.parse().unwrap_or(u32::MAX), s.clone())
        }
        Some(nft_value::Value::Proto(p)) => (3, *p as u128, 0, String::new()),
        Some(nft_value::Value::Port(r)) => (4, u128::from(r.first), r.last, String::new()),
        Some(nft_value::Value::Mark(m)) => (5, u128::from(*m), 0, String::new()),
        Some(nft_value::Value::Id(i)) => (6, u128::from(*i), 0, String::new()),
    }
}

/// The version of a state: the hex sha256 of its canonical protobuf encoding.
pub fn version(state: &NodeState) -> String {
    let mut canonical = state.clone();
    canonicalize(&mut canonical);
    hex::encode(Sha256::digest(canonical.encode_to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{NftSet, NftTable, PortRange};

    fn port(first: u32) -> NftValue {
        NftValue { value: Some(nft_value::Value::Port(PortRange { first, last: first })) }
    }

    fn state(ports: &[u32]) -> NodeState {
        let elements = ports.iter().map(|p| NftElement { key: vec![port(*p)], data: vec![] }).collect();
        NodeState {
            node: "n".into(),
            netns: vec![NetnsState {
                nft_tables: vec![NftTable {
                    name: "kuport".into(),
                    sets: vec![NftSet { name: "s".into(), elements, ..Default::default() }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn version_ignores_element_order() {
        assert_eq!(version(&state(&[9, 80, 443])), version(&state(&[443, 9, 80])));
        assert_ne!(version(&state(&[9, 80])), version(&state(&[9, 81])));
    }

    #[test]
    fn ports_sort_numerically() {
        let mut s = state(&[443, 9, 80]);
        canonicalize(&mut s);
        let firsts: Vec<u32> = s.netns[0].nft_tables[0].sets[0]
            .elements
            .iter()
            .filter_map(|e| match &e.key[0].value {
                Some(nft_value::Value::Port(r)) => Some(r.first),
                _ => None,
            })
            .collect();
        assert_eq!(firsts, vec![9, 80, 443]);
    }
}
