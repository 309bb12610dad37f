//! The node-scoped allocator: the packet marks, routing tables and ip rule preferences kuport
//! uses on a node. Every capability draws them from here, so no two capabilities (and no two
//! objects of one) ever use the same number on a node.
//!
//! Marks and tables go together, as a slot of the node: slot n is mark `MARK_PREFIX + n` and
//! table `TABLE_BASE + n`. Rule preferences are fixed per rule, since their order against other
//! software's rules matters; [`Rule`] lists every rule kuport places. docs/portmap/links.md
//! gives the port map's numbering.

use std::collections::BTreeMap;

pub use kuport_proto::owned::{MAIN_TABLE, MARK_PREFIX, MARK_PREFIX_MASK, MAX_SLOT, RESERVED_TABLES, TABLE_BASE};

/// One slot of a node: a packet mark and a routing table. Slot 0 is never used: its mark would
/// be the bare prefix, which means "no link".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot(pub u32);

impl Slot {
    pub fn mark(self) -> u32 {
        MARK_PREFIX + self.0
    }

    pub fn table(self) -> u32 {
        TABLE_BASE + self.0
    }

    /// Whether the slot's table is one the kernel reserves.
    fn reserved(self) -> bool {
        TABLE_BASE.checked_add(self.0).is_some_and(|t| RESERVED_TABLES.contains(&t))
    }
}

/// Every ip rule kuport places, each at a preference of its own. They sort before the mesh's
/// rules (netbird resolves at 105 and catches everything unmarked at 110).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// Port map: a marked packet bound for the link peer's underlay goes by main.
    LoopGuard,
    /// Port map: a marked reply goes by its link's table.
    Divert,
}

impl Rule {
    pub const ALL: [Rule; 2] = [Rule::LoopGuard, Rule::Divert];

    pub fn preference(self) -> u32 {
        match self {
            Rule::LoopGuard => kuport_proto::owned::PREF_LOOP_GUARD,
            Rule::Divert => kuport_proto::owned::PREF_DIVERT,
        }
    }
}

/// Used numbers as runs of consecutive numbers (start -> end, inclusive), so that the next free
/// number at or after any number is one lookup: a first compute claims thousands of links per
/// class, and scanning slots from 1 for each was quadratic (14.8 s at 5,000 nodes).
#[derive(Clone, Debug, Default)]
pub struct Runs(BTreeMap<u32, u32>);

impl Runs {
    pub fn insert(&mut self, x: u32) {
        let (mut start, mut end) = (x, x);
        if let Some((&s, &e)) = self.0.range(..=x).next_back() {
            if e >= x {
                return;
            }
            if e.checked_add(1) == Some(x) {
                start = s;
            }
        }
        if let Some(next) = x.checked_add(1)
            && let Some(e) = self.0.remove(&next)
        {
            end = e;
        }
        self.0.insert(start, end);
    }

    /// The lowest number at or after `x` that is not used (saturating at u32::MAX).
    pub fn next_free(&self, x: u32) -> u32 {
        match self.0.range(..=x).next_back() {
            Some((_, &end)) if end >= x => end.saturating_add(1),
            _ => x,
        }
    }
}

/// The slots one node uses, whatever claimed them.
#[derive(Clone, Debug, Default)]
pub struct NodeNumbers {
    slots: Runs,
}

static NO_NUMBERS: NodeNumbers = NodeNumbers { slots: Runs(BTreeMap::new()) };

/// The lowest slot at or after `from` that is free on every node of `nodes` and whose table
/// the kernel does not reserve (saturating at u32::MAX).
pub fn next_free(nodes: &[&NodeNumbers], from: u32) -> u32 {
    let mut slot = from;
    loop {
        let next = nodes.iter().fold(slot, |s, n| n.slots.next_free(s));
        let next = if Slot(next).reserved() { next.saturating_add(1) } else { next };
        if next == slot {
            return slot;
        }
        slot = next;
    }
}

/// Every node's numbers, for one compute; kept with the port maps' links for the next claim.
#[derive(Clone, Debug, Default)]
pub struct Numbers {
    nodes: super::Shared<String, NodeNumbers>,
}

impl Numbers {
    /// What `node` uses so far.
    pub fn on(&self, node: &str) -> &NodeNumbers {
        self.nodes.get(node).unwrap_or(&NO_NUMBERS)
    }

    /// Records `slot` as used on `node`: a claim kept from before, or one just chosen with
    /// [`next_free`].
    pub fn take(&mut self, node: &str, slot: Slot) {
        match self.nodes.get_mut(node) {
            Some(n) => n.slots.insert(slot.0),
            None => {
                let mut n = NodeNumbers::default();
                n.slots.insert(slot.0);
                self.nodes.insert(node.to_string(), n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_free_skips_whole_runs_and_inserts_merge() {
        let mut r = Runs::default();
        assert_eq!(r.next_free(1), 1);
        for x in [1, 2, 3, 7, 5, 6] {
            r.insert(x);
        }
        assert_eq!(r.0.iter().map(|(a, b)| (*a, *b)).collect::<Vec<_>>(), vec![(1, 3), (5, 7)]);
        assert_eq!(r.next_free(1), 4);
        assert_eq!(r.next_free(4), 4);
        assert_eq!(r.next_free(5), 8);
        r.insert(4);
        assert_eq!(r.0.iter().map(|(a, b)| (*a, *b)).collect::<Vec<_>>(), vec![(1, 7)]);
        r.insert(3);
        assert_eq!(r.next_free(2), 8);
        r.insert(u32::MAX);
        assert_eq!(r.next_free(u32::MAX), u32::MAX);
    }

    #[test]
    fn a_slot_is_free_on_every_node_and_never_a_reserved_table() {
        let mut n = Numbers::default();
        for s in [1, 2, 4] {
            n.take("a", Slot(s));
        }
        n.take("b", Slot(3));
        assert_eq!(next_free(&[n.on("a"), n.on("b")], 1), 5);
        assert_eq!(next_free(&[n.on("a")], 1), 3);
        assert_eq!(next_free(&[n.on("unknown")], 1), 1);
        // Tables 253 to 255 are the kernel's.
        assert_eq!(next_free(&[n.on("b")], 53), 56);
        n.take("a", Slot(52));
        n.take("a", Slot(56));
        assert_eq!(next_free(&[n.on("a")], 52), 57);
    }

    #[test]
    fn rule_preferences_are_distinct_and_before_the_mesh() {
        let prefs: std::collections::BTreeSet<u32> = Rule::ALL.iter().map(|r| r.preference()).collect();
        assert_eq!(prefs.len(), Rule::ALL.len());
        assert!(prefs.iter().all(|p| *p < 105));
    }
}
