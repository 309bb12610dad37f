//! The canonical order of a node state, its sets' digests, and its version.
//!
//! Two controllers that compute the same state must send the same bytes, so that an executor can
//! compare versions instead of states. Every repeated field whose order carries no meaning is
//! sorted here; rule order inside a chain carries meaning and is kept.
//!
//! Each nftables set also gets a digest of its elements ([`set_digest`]), so that an executor
//! that remembers what it applied can skip an unchanged set without walking its elements.

use std::net::IpAddr;

use prost::Message;
use sha2::{Digest, Sha256};

use crate::v1::{NetnsState, NftElement, NftValue, NodeState, nft_value};

/// Sorts every order-free list in `state` into its canonical order (and drops exact
/// duplicates), then sets every nftables set's `digest` to the [`set_digest`] of its elements.
pub fn canonicalize(state: &mut NodeState) {
    order(state);
    for ns in &mut state.netns {
        for table in &mut ns.nft_tables {
            for set in &mut table.sets {
                set.digest = set_digest(&set.elements);
            }
        }
    }
}

/// The canonical order alone: sorts like [`canonicalize`] but clears every set's digest
/// instead of computing it. For tables that are compared rather than sent (a normal form, a
/// table read back from the kernel), where a digest would only cost time or differ spuriously.
pub fn order(state: &mut NodeState) {
    state.netns.sort_by(|a, b| a.path.cmp(&b.path));
    for ns in &mut state.netns {
        canonicalize_netns(ns);
    }
}

/// The digest of a set's elements, in the order given (canonical once sorted): the sha256 of
/// every element's protobuf encoding, each prefixed with its length as a varint (prost's
/// `encode_length_delimited`), concatenated. The length prefix keeps two different lists from
/// concatenating to the same bytes. 32 bytes, also for an empty set.
pub fn set_digest(elements: &[NftElement]) -> Vec<u8> {
    let mut h = Sha256::new();
    let mut buf = Vec::with_capacity(128);
    for e in elements {
        buf.clear();
        // Encoding into a Vec cannot fail: it grows as needed.
        if e.encode_length_delimited(&mut buf).is_ok() {
            h.update(&buf);
        }
    }
    h.finalize().to_vec()
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
            set.digest.clear();
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

/// The version of a state: the hex sha256 of its canonical protobuf encoding (digests included,
/// which are a function of the elements).
pub fn version(state: &NodeState) -> String {
    let mut canonical = state.clone();
    canonicalize(&mut canonical);
    canonical_version(&canonical)
}

/// [`version`] of a state [`canonicalize`] already ordered (as every state the controller
/// computes is): no copy, no second sort, no second set digest.
pub fn canonical_version(state: &NodeState) -> String {
    hex::encode(Sha256::digest(state.encode_to_vec()))
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

    fn digest_of(s: &NodeState) -> Vec<u8> {
        s.netns[0].nft_tables[0].sets[0].digest.clone()
    }

    #[test]
    fn canonicalize_fills_digests_and_order_clears_them() {
        let mut s = state(&[443, 9, 80]);
        canonicalize(&mut s);
        assert_eq!(digest_of(&s), set_digest(&s.netns[0].nft_tables[0].sets[0].elements));
        assert_eq!(digest_of(&s).len(), 32);
        let mut sorted = state(&[80, 9, 443]);
        canonicalize(&mut sorted);
        assert_eq!(digest_of(&s), digest_of(&sorted));
        order(&mut s);
        assert!(digest_of(&s).is_empty());
        // A duplicate is dropped before the digest is taken.
        let mut dup = state(&[9, 443, 80, 9]);
        canonicalize(&mut dup);
        assert_eq!(digest_of(&dup), digest_of(&sorted));
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
