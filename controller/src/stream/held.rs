//! What an executor holds, per namespace, on one NodeSync connection: a namespace whose version
//! the executor acknowledged is sent as a stub (`held`, no content), so a change in one
//! namespace does not resend the others. A refusal makes the next state go whole.

use std::collections::{BTreeSet, VecDeque};

use kuport_proto::v1::{Ack, DesiredState, NetnsState, NodeState};

/// States sent and not answered yet, at most this many: an answer to an older one finds
/// nothing and holds nothing, which costs only a whole send.
const IN_FLIGHT: usize = 8;

/// One connection's record of what its executor holds.
#[derive(Debug, Default)]
pub struct Held {
    /// Versions of the namespaces the executor holds whichever state in flight it applies.
    held: BTreeSet<String>,
    /// States sent and not answered: each one's version and its namespaces' versions, oldest
    /// first.
    sent: VecDeque<(String, BTreeSet<String>)>,
}

impl Held {
    /// The message that sends `ds`: each namespace the executor holds goes as a stub. The
    /// state's version is unchanged (a stub counts by the version it names).
    pub fn outgoing(&mut self, ds: &DesiredState) -> DesiredState {
        let Some(state) = &ds.state else { return ds.clone() };
        let versions: BTreeSet<String> =
            state.netns.iter().filter(|ns| !ns.version.is_empty()).map(|ns| ns.version.clone()).collect();
        let netns = state
            .netns
            .iter()
            .map(|ns| {
                if !ns.version.is_empty() && self.held.contains(&ns.version) {
                    NetnsState {
                        target: ns.target.clone(),
                        version: ns.version.clone(),
                        held: true,
                        ..Default::default()
                    }
                } else {
                    ns.clone()
                }
            })
            .collect();
        // Once it has this state, the executor holds only what it names.
        self.held.retain(|v| versions.contains(v));
        self.sent.push_back((ds.version.clone(), versions));
        if self.sent.len() > IN_FLIGHT {
            self.sent.pop_front();
        }
        DesiredState {
            term: ds.term,
            sequence: ds.sequence,
            version: ds.version.clone(),
            state: Some(NodeState { node: state.node.clone(), netns }),
        }
    }

    /// The executor answered a state: after an ok, it holds that state's namespaces, less those
    /// a state sent since changes; after a refusal, nothing is counted as held.
    pub fn answered(&mut self, ack: &Ack) {
        let Some(i) = self.sent.iter().rposition(|(version, _)| *version == ack.version) else {
            self.held.clear();
            return;
        };
        let answered: Vec<_> = self.sent.drain(..=i).collect();
        if !ack.ok {
            self.held.clear();
            return;
        }
        let mut held = answered.into_iter().next_back().map(|(_, v)| v).unwrap_or_default();
        for (_, later) in &self.sent {
            held.retain(|v| later.contains(v));
        }
        self.held = held;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(path: &str, content: &str) -> NetnsState {
        let mut ns = NetnsState { target: kuport_proto::netns::path(path), ..Default::default() };
        ns.sysctls.push(kuport_proto::v1::Sysctl { key: content.into(), value: "1".into() });
        ns.version = kuport_proto::canonical::netns_version(&ns);
        ns
    }

    fn state(sequence: u64, netns: Vec<NetnsState>) -> DesiredState {
        let state = NodeState { node: "n".into(), netns };
        DesiredState { term: 1, sequence, version: kuport_proto::canonical_version(&state), state: Some(state) }
    }

    fn ack(ds: &DesiredState, ok: bool) -> Ack {
        Ack { term: ds.term, sequence: ds.sequence, version: ds.version.clone(), ok, errors: Vec::new() }
    }

    fn held(ds: &DesiredState) -> Vec<bool> {
        ds.state.iter().flat_map(|s| &s.netns).map(|n| n.held).collect()
    }

    #[test]
    fn acknowledged_namespaces_go_as_stubs_until_a_refusal() {
        let mut h = Held::default();
        let (a, b0, b1) = (ns("/a", "x"), ns("/b", "y"), ns("/b", "z"));
        let s1 = state(1, vec![a.clone(), b0.clone()]);
        assert_eq!(held(&h.outgoing(&s1)), [false, false], "nothing acknowledged yet");
        h.answered(&ack(&s1, true));
        let s2 = state(2, vec![a.clone(), b1.clone()]);
        let sent = h.outgoing(&s2);
        assert_eq!(held(&sent), [true, false]);
        let stub = &sent.state.as_ref().expect("state").netns[0];
        assert_eq!(
            (stub.target.clone(), stub.version.clone(), stub.sysctls.len()),
            (a.target.clone(), a.version.clone(), 0)
        );
        assert_eq!(sent.version, s2.version, "the state keeps its version");
        assert_eq!(kuport_proto::canonical_version(sent.state.as_ref().expect("state")), s2.version);
        h.answered(&ack(&s2, false));
        assert_eq!(held(&h.outgoing(&state(3, vec![a, b1]))), [false, false], "whole after a refusal");
    }

    #[test]
    fn a_namespace_a_state_in_flight_changes_is_not_held() {
        let mut h = Held::default();
        let (a0, a1) = (ns("/a", "x"), ns("/a", "y"));
        let s1 = state(1, vec![a0.clone()]);
        h.outgoing(&s1);
        let s2 = state(2, vec![a1]);
        h.outgoing(&s2);
        // The executor acks s1 while s2 is on its way: it may hold a0 or a1.
        h.answered(&ack(&s1, true));
        assert_eq!(held(&h.outgoing(&state(3, vec![a0.clone()]))), [false]);
        h.answered(&ack(&s2, true));
        assert_eq!(held(&h.outgoing(&state(4, vec![a0]))), [false], "s3 went out after s2");
    }
}
