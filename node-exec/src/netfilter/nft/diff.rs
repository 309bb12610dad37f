//! Named differences between a desired table and the kernel's.

use std::collections::BTreeMap;
use std::fmt;

use kuport_proto::v1::{NftElement, NftSet, NftTable};

use super::encode::{element_name, rule_name};

/// One difference, named so that a log line says what drifted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftDiff {
    MissingTable,
    MissingSet(String),
    ExtraSet(String),
    /// Types, flags or counter differ.
    ChangedSet(String),
    MissingElement {
        set: String,
        element: String,
    },
    ExtraElement {
        set: String,
        element: String,
    },
    /// Same key, different data.
    ChangedElement {
        set: String,
        element: String,
    },
    MissingChain(String),
    ExtraChain(String),
    /// Hook, type, priority or policy differ.
    ChangedChain(String),
    MissingRule {
        chain: String,
        index: usize,
    },
    ExtraRule {
        chain: String,
        index: usize,
    },
    ChangedRule {
        chain: String,
        index: usize,
    },
    /// The table holds something the decoder refuses (an expression outside kuport's
    /// vocabulary, or one of its own in another shape): it is not kuport's table.
    Unreadable(String),
}

impl NftDiff {
    /// Element differences can be fixed element by element; anything else rebuilds the table.
    pub fn is_element(&self) -> bool {
        matches!(self, NftDiff::MissingElement { .. } | NftDiff::ExtraElement { .. } | NftDiff::ChangedElement { .. })
    }
}

impl fmt::Display for NftDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NftDiff::MissingTable => write!(f, "table missing"),
            NftDiff::MissingSet(s) => write!(f, "set {s} missing"),
            NftDiff::ExtraSet(s) => write!(f, "set {s} not desired"),
            NftDiff::ChangedSet(s) => write!(f, "set {s} changed"),
            NftDiff::MissingElement { set, element } => write!(f, "element {element} missing from set {set}"),
            NftDiff::ExtraElement { set, element } => write!(f, "element {element} of set {set} not desired"),
            NftDiff::ChangedElement { set, element } => write!(f, "element {element} of set {set} changed"),
            NftDiff::MissingChain(c) => write!(f, "chain {c} missing"),
            NftDiff::ExtraChain(c) => write!(f, "chain {c} not desired"),
            NftDiff::ChangedChain(c) => write!(f, "chain {c} changed"),
            NftDiff::MissingRule { chain, index } => write!(f, "{} missing", rule_name(chain, *index)),
            NftDiff::ExtraRule { chain, index } => write!(f, "{} not desired", rule_name(chain, *index)),
            NftDiff::ChangedRule { chain, index } => write!(f, "{} changed", rule_name(chain, *index)),
            NftDiff::Unreadable(what) => write!(f, "table unreadable: {what}"),
        }
    }
}

/// What declares a set, beside its name: a difference recreates it.
pub(crate) fn header(s: &NftSet) -> (&[i32], &[i32], bool, bool, bool, u32, u32) {
    (&s.key, &s.data, s.interval, s.counter, s.dynamic, s.size, s.timeout_seconds)
}

/// A set's elements by key (the Debug form of the key is an exact, hashable identity).
pub(crate) fn by_key(set: &NftSet) -> BTreeMap<String, &NftElement> {
    set.elements.iter().map(|e| (format!("{:?}", e.key), e)).collect()
}

/// The differences from `actual` to `desired`. Both must be in normal form
/// (see [`super::normalize`]).
pub fn diff(desired: &NftTable, actual: Option<&NftTable>) -> Vec<NftDiff> {
    let Some(actual) = actual else { return vec![NftDiff::MissingTable] };
    let mut out = Vec::new();
    for want in &desired.sets {
        match actual.sets.iter().find(|s| s.name == want.name) {
            None => out.push(NftDiff::MissingSet(want.name.clone())),
            Some(have) if header(have) != header(want) => out.push(NftDiff::ChangedSet(want.name.clone())),
            Some(have) => {
                let (w, h) = (by_key(want), by_key(have));
                for (k, e) in &w {
                    match h.get(k) {
                        None => out.push(NftDiff::MissingElement { set: want.name.clone(), element: element_name(e) }),
                        Some(he) if he.data != e.data => {
                            out.push(NftDiff::ChangedElement { set: want.name.clone(), element: element_name(e) })
                        }
                        Some(_) => {}
                    }
                }
                for (k, e) in &h {
                    if !w.contains_key(k) {
                        out.push(NftDiff::ExtraElement { set: want.name.clone(), element: element_name(e) });
                    }
                }
            }
        }
    }
    for have in &actual.sets {
        if !desired.sets.iter().any(|s| s.name == have.name) {
            out.push(NftDiff::ExtraSet(have.name.clone()));
        }
    }
    let actual_chains = super::table::by_name(&actual.chains);
    for want in &desired.chains {
        match actual_chains.get(want.name.as_str()) {
            None => out.push(NftDiff::MissingChain(want.name.clone())),
            Some(have) => {
                if have.base != want.base {
                    out.push(NftDiff::ChangedChain(want.name.clone()));
                }
                for i in 0..want.rules.len().max(have.rules.len()) {
                    let chain = want.name.clone();
                    match (want.rules.get(i), have.rules.get(i)) {
                        (Some(_), None) => out.push(NftDiff::MissingRule { chain, index: i }),
                        (None, Some(_)) => out.push(NftDiff::ExtraRule { chain, index: i }),
                        (Some(w), Some(h)) if w != h => out.push(NftDiff::ChangedRule { chain, index: i }),
                        _ => {}
                    }
                }
            }
        }
    }
    let desired_chains = super::table::by_name(&desired.chains);
    for have in &actual.chains {
        if !desired_chains.contains_key(have.name.as_str()) {
            out.push(NftDiff::ExtraChain(have.name.clone()));
        }
    }
    out
}
