//! The per-set digest that `canonicalize` computes: it changes exactly when the set's elements
//! change, whatever order they were given in, and nothing that renders a set shows it.

use kuport_proto::canonical::{order, set_digest};
use kuport_proto::canonicalize;
use kuport_proto::v1::{NetnsState, NftElement, NftSet, NftTable, NftType, NftValue, NodeState, PortRange, nft_value};
use proptest::prelude::*;

fn element(ip: u8, port: u16, mark: u8) -> NftElement {
    let v = |v| NftValue { value: Some(v) };
    NftElement {
        key: vec![
            v(nft_value::Value::Addr(format!("10.244.0.{ip}"))),
            v(nft_value::Value::Port(PortRange { first: u32::from(port), last: u32::from(port) })),
        ],
        data: vec![v(nft_value::Value::Mark(u32::from(mark)))],
    }
}

fn state(elements: Vec<NftElement>) -> NodeState {
    NodeState {
        node: "n".into(),
        netns: vec![NetnsState {
            nft_tables: vec![NftTable {
                family: 1,
                name: "kuport".into(),
                sets: vec![NftSet {
                    name: "return_mark".into(),
                    key: vec![NftType::Ipv4Addr as i32, NftType::InetService as i32],
                    data: vec![NftType::Mark as i32],
                    elements,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn canonical_set(elements: Vec<NftElement>) -> NftSet {
    let mut s = state(elements);
    canonicalize(&mut s);
    s.netns[0].nft_tables[0].sets.remove(0)
}

/// Up to 12 elements from a small value space, so that equal and near-equal sets are common.
fn elements() -> impl Strategy<Value = Vec<(u8, u16, u8)>> {
    prop::collection::vec((0u8..4, 0u16..3, 0u8..2), 0..12)
}

fn build(v: &[(u8, u16, u8)]) -> Vec<NftElement> {
    v.iter().map(|(a, p, m)| element(*a, *p, *m)).collect()
}

proptest! {
    #[test]
    fn digest_changes_iff_the_elements_change(a in elements(), b in elements()) {
        let (sa, sb) = (canonical_set(build(&a)), canonical_set(build(&b)));
        prop_assert_eq!(sa.digest.len(), 32);
        prop_assert_eq!(sa.elements == sb.elements, sa.digest == sb.digest);
    }

    #[test]
    fn digest_ignores_input_order(a in elements(), seed in any::<u64>()) {
        let mut shuffled = build(&a);
        // A deterministic shuffle from the seed (Fisher-Yates with an LCG).
        let mut x = seed;
        for i in (1..shuffled.len()).rev() {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            shuffled.swap(i, (x >> 33) as usize % (i + 1));
        }
        let (sa, sb) = (canonical_set(build(&a)), canonical_set(shuffled));
        prop_assert_eq!(&sa.elements, &sb.elements);
        prop_assert_eq!(sa.digest, sb.digest);
    }
}

#[test]
fn digest_is_the_sha256_of_the_canonical_elements() {
    let set = canonical_set(build(&[(3, 1, 0), (1, 2, 1), (1, 0, 0)]));
    assert_eq!(set.digest, set_digest(&set.elements));
    // One element more, one less, one changed: each a different digest.
    let more = canonical_set(build(&[(3, 1, 0), (1, 2, 1), (1, 0, 0), (2, 2, 0)]));
    let less = canonical_set(build(&[(3, 1, 0), (1, 2, 1)]));
    let changed = canonical_set(build(&[(3, 1, 0), (1, 2, 1), (1, 0, 1)]));
    for other in [&more, &less, &changed] {
        assert_ne!(set.digest, other.digest);
    }
    // An empty set has a digest too (of nothing), distinct from any non-empty one.
    let empty = canonical_set(Vec::new());
    assert_eq!(empty.digest.len(), 32);
    assert_ne!(empty.digest, set.digest);
}

#[test]
fn order_alone_leaves_no_digest() {
    let mut s = state(build(&[(3, 1, 0), (1, 2, 1)]));
    canonicalize(&mut s);
    let canonical = s.clone();
    order(&mut s);
    let set = &s.netns[0].nft_tables[0].sets[0];
    assert!(set.digest.is_empty());
    assert_eq!(set.elements, canonical.netns[0].nft_tables[0].sets[0].elements);
}

#[test]
fn the_text_does_not_show_the_digest() {
    let plain = state(build(&[(3, 1, 0), (1, 2, 1)]));
    let mut canonical = plain.clone();
    canonicalize(&mut canonical);
    let mut sorted = plain;
    order(&mut sorted);
    assert!(!canonical.netns[0].nft_tables[0].sets[0].digest.is_empty());
    assert_eq!(kuport_proto::text::node_state(&canonical), kuport_proto::text::node_state(&sorted));
    assert_eq!(
        kuport_proto::text::nft_table(&canonical.netns[0].nft_tables[0]),
        kuport_proto::text::nft_table(&sorted.netns[0].nft_tables[0])
    );
}
