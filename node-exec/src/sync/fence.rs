//! Version fencing: which incoming states may be applied.
//!
//! Every state carries the leader's term and a sequence number that grows within a term. A
//! state is applied only when its (term, sequence) is greater than that of every state this
//! executor saw before, so a reordered or stale message never replaces a newer state, and a
//! new leader (greater term) always wins over the old one.

use kuport_proto::v1::{Applied, DesiredState};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fence {
    /// The newest (term, sequence) seen, applied or refused.
    seen: Option<(u64, u64)>,
    /// The last state applied successfully.
    applied: Option<Applied>,
}

impl Fence {
    /// A fence that starts from a state applied before (read from the store).
    pub fn from_applied(applied: Option<Applied>) -> Self {
        Fence { seen: applied.as_ref().map(|a| (a.term, a.sequence)), applied }
    }

    /// A fence after a stored state at (`term`, `sequence`) was refused at start: nothing is
    /// applied, and that state or a newer one is admitted, an older one not.
    pub fn after_refused(term: u64, sequence: u64) -> Self {
        let before = match (term, sequence) {
            (0, 0) => None,
            (t, 0) => Some((t - 1, u64::MAX)),
            (t, s) => Some((t, s - 1)),
        };
        Fence { seen: before, applied: None }
    }

    /// Whether `state` is newer than everything seen.
    pub fn admits(&self, state: &DesiredState) -> bool {
        self.seen.is_none_or(|seen| (state.term, state.sequence) > seen)
    }

    /// Records that `state` was answered (applied when `ok`).
    pub fn record(&mut self, state: &DesiredState, ok: bool) {
        self.seen = Some((state.term, state.sequence));
        if ok {
            self.applied = Some(Applied { term: state.term, sequence: state.sequence, version: state.version.clone() });
        }
    }

    pub fn applied(&self) -> Option<&Applied> {
        self.applied.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(term: u64, sequence: u64) -> DesiredState {
        DesiredState { term, sequence, version: format!("v{term}.{sequence}"), state: None }
    }

    #[test]
    fn only_newer_term_or_sequence_is_admitted() {
        let mut f = Fence::default();
        assert!(f.admits(&st(1, 1)));
        f.record(&st(1, 5), true);
        assert!(!f.admits(&st(1, 5)), "the same state again");
        assert!(!f.admits(&st(1, 4)), "an older sequence");
        assert!(!f.admits(&st(0, 99)), "an older leader");
        assert!(f.admits(&st(1, 6)));
        assert!(f.admits(&st(2, 1)), "a new leader starts its own sequence");
        f.record(&st(2, 1), false);
        assert!(!f.admits(&st(1, 7)), "the old leader lost, even though the new state was refused");
        assert_eq!(f.applied().map(|a| a.version.as_str()), Some("v1.5"), "a refusal keeps the applied version");
    }

    #[test]
    fn a_stored_state_fences_after_a_restart() {
        let f = Fence::from_applied(Some(Applied { term: 3, sequence: 2, version: "x".into() }));
        assert!(!f.admits(&st(3, 2)));
        assert!(!f.admits(&st(2, 10)));
        assert!(f.admits(&st(3, 3)));
    }

    #[test]
    fn a_refused_stored_state_may_be_applied_again_but_fences_older_ones() {
        let f = Fence::after_refused(3, 2);
        assert_eq!(f.applied(), None);
        assert!(f.admits(&st(3, 2)), "the same state, sent again");
        assert!(f.admits(&st(3, 3)));
        assert!(!f.admits(&st(3, 1)));
        assert!(!f.admits(&st(2, 10)), "an older leader");
        let f = Fence::after_refused(3, 0);
        assert!(f.admits(&st(3, 0)) && !f.admits(&st(2, u64::MAX - 1)));
        assert!(Fence::after_refused(0, 0).admits(&st(0, 0)));
    }
}
