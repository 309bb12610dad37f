//! The per-set digest that `canonicalize` computes: it changes exactly when the set's elements
//! change, whatever order they were given in, and nothing that renders a set shows it.

use kuport_proto::build::{addr, element, mark, port, set};
use kuport_proto::canonical::{RUN_SPAN, element_runs, order, set_digest};
use kuport_proto::canonicalize;
use kuport_proto::v1::{NetnsState, NftElement, NftSet, NftTable, NftType, NodeState};
use proptest::prelude::*;

fn return_mark(ip: u8, p: u16, m: u8) -> NftElement {
    element(vec![addr(format!("10.244.0.{ip}")), port(u32::from(p))], vec![mark(u32::from(m))])
}

fn state(elements: Vec<NftElement>) -> NodeState {
    NodeState {
        node: "n".into(),
        netns: vec![NetnsState {
            nft_tables: vec![NftTable {
                family: 1,
                name: "kuport".into(),
                sets: vec![set("return_mark", &[NftType::Ipv4Addr, NftType::InetService], &[NftType::Mark], elements)]
                    .into(),
                ..Default::default()
            }]
            .into(),
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
    v.iter().map(|(a, p, m)| return_mark(*a, *p, *m)).collect()
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
    assert!(set.digest.is_empty() && set.runs.is_empty());
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

/// `n` distinct elements of a large set (ports 1 to 65,535 of up to 250 addresses).
fn large(n: usize, skip: u32) -> Vec<NftElement> {
    (0..n as u32)
        .filter(|i| *i != skip)
        .map(|i| return_mark((i / 65_000) as u8, (i % 65_000 + 1) as u16, (i % 2) as u8))
        .collect()
}

/// How many runs two run lists share at their start and at their end (not overlapping).
fn shared_runs(a: &[kuport_proto::v1::ElementRun], b: &[kuport_proto::v1::ElementRun]) -> usize {
    let head = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let tail = a[head..].iter().rev().zip(b[head..].iter().rev()).take_while(|(x, y)| x == y).count();
    head + tail
}

#[test]
fn runs_cover_the_elements_and_average_the_span() {
    let set = canonical_set(large(20_000, u32::MAX));
    let total: u32 = set.runs.iter().map(|r| r.elements).sum();
    assert_eq!(total as usize, set.elements.len());
    assert!(set.runs.iter().all(|r| r.elements > 0 && r.digest.len() == 32));
    // Content-defined cuts: the mean run is about RUN_SPAN long (a loose bound, the cuts are
    // deterministic for these elements).
    let mean = set.elements.len() / set.runs.len();
    assert!((RUN_SPAN as usize / 2..RUN_SPAN as usize * 2).contains(&mean), "mean run {mean}");
    assert_eq!((set.runs.clone(), set.digest.clone()), element_runs(&set.elements));
    // The empty set has no runs and still a digest.
    let empty = canonical_set(Vec::new());
    assert!(empty.runs.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Wherever one element goes in or out, every other run stays: the executor then compares
    /// the elements of at most two runs.
    #[test]
    fn one_element_more_changes_at_most_two_runs(skip in 0u32..5_000) {
        let (with, without) = (canonical_set(large(5_000, u32::MAX)), canonical_set(large(5_000, skip)));
        prop_assert!(shared_runs(&with.runs, &without.runs) + 2 >= with.runs.len());
        prop_assert!(shared_runs(&with.runs, &without.runs) + 2 >= without.runs.len());
        prop_assert_ne!(with.digest, without.digest);
    }
}
