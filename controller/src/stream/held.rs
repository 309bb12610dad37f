//! What an executor holds, per namespace, on one NodeSync connection: a namespace whose version
//! the executor acknowledged is sent as a stub (`held`, no content), and one it holds an older
//! version of as a delta from that version ([`kuport_proto::delta`]), so a change sends what
//! changed. A refusal makes the next state go whole.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use kuport_proto::v1::{Ack, DesiredState, NetnsState, NodeState};
use prost::Message as _;

/// States sent and not answered yet, at most this many: an answer to an older one finds
/// nothing and holds nothing, which costs only a whole send.
const IN_FLIGHT: usize = 8;

/// One connection's record of what its executor holds.
#[derive(Clone, Debug, Default)]
pub struct Held {
    /// Versions of the namespaces the executor holds whichever state in flight it applies.
    held: BTreeSet<String>,
    /// The last state the executor applied: the content of the versions it holds.
    applied: Option<Arc<DesiredState>>,
    /// States sent and not answered, oldest first.
    sent: VecDeque<Sent>,
    /// The version of the state the executor said in Hello it applied, until the first send.
    claimed: Option<String>,
}

#[derive(Clone, Debug)]
struct Sent {
    state: Arc<DesiredState>,
    /// Its namespaces' versions.
    versions: BTreeSet<String>,
    /// Whether it went with stubs or deltas, which only a holder of their base can apply.
    partial: bool,
}

impl Held {
    /// The record of a connection whose executor said in Hello it applied the state of version
    /// `claimed`. When the first state sent has that version, the executor holds each of its
    /// namespaces, which go as stubs: a new leader, or the same one after a reconnect, sends
    /// nothing it did not change. A false claim costs a refusal and a whole send.
    pub fn claiming(claimed: Option<String>) -> Self {
        Held { claimed, ..Held::default() }
    }

    /// The message that sends `ds`: each namespace the executor holds goes as a stub, each it
    /// holds another version of as a delta when that is smaller. The state's version is
    /// unchanged (a stub or a delta counts by the version it names).
    pub fn outgoing(&mut self, ds: &Arc<DesiredState>) -> DesiredState {
        let Some(state) = &ds.state else { return DesiredState::clone(ds) };
        let versions: BTreeSet<String> =
            state.netns.iter().filter(|ns| !ns.version.is_empty()).map(|ns| ns.version.clone()).collect();
        if self.claimed.take().is_some_and(|v| v == ds.version) && self.sent.is_empty() {
            self.held = versions.clone();
            self.applied = Some(ds.clone());
        }
        let mut partial = false;
        let netns = state
            .netns
            .iter()
            .map(|ns| {
                if ns.version.is_empty() {
                    return ns.clone();
                }
                if self.held.contains(&ns.version) {
                    partial = true;
                    return NetnsState {
                        target: ns.target.clone(),
                        version: ns.version.clone(),
                        held: true,
                        ..Default::default()
                    };
                }
                match self.base(ns).map(|base| kuport_proto::delta::diff(base, ns)) {
                    Some(delta) if delta.encoded_len() < ns.encoded_len() => {
                        partial = true;
                        delta
                    }
                    _ => ns.clone(),
                }
            })
            .collect();
        // Once it has this state, the executor holds only what it names.
        self.held.retain(|v| versions.contains(v));
        self.sent.push_back(Sent { state: ds.clone(), versions, partial });
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

    /// The namespace at `ns`'s target the executor holds, whichever state in flight it applies.
    fn base(&self, ns: &NetnsState) -> Option<&NetnsState> {
        let applied = self.applied.as_ref()?.state.as_ref()?;
        applied.netns.iter().find(|b| b.target == ns.target && self.held.contains(&b.version))
    }

    /// The executor answered a state: after an ok, it holds that state's namespaces, less those
    /// a state sent since changes; after a refusal, nothing is counted as held. True when the
    /// refused state went with stubs or deltas and the executor asks for it whole (it holds
    /// another version than their base): the caller sends the state again, whole. A refusal by
    /// the kernel is not sent again: it would be refused again.
    pub fn answered(&mut self, ack: &Ack) -> bool {
        let Some(i) = self.sent.iter().rposition(|s| s.state.version == ack.version) else {
            self.forget();
            return false;
        };
        let Some(answered) = self.sent.drain(..=i).next_back() else { return false };
        if !ack.ok {
            self.forget();
            return answered.partial && ack.errors.iter().any(|e| kuport_proto::delta::asks_whole(&e.reason));
        }
        let mut held = answered.versions;
        for later in &self.sent {
            held.retain(|v| later.versions.contains(v));
        }
        self.held = held;
        self.applied = Some(answered.state);
        false
    }

    fn forget(&mut self) {
        self.held.clear();
        self.applied = None;
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

    fn state(sequence: u64, netns: Vec<NetnsState>) -> Arc<DesiredState> {
        let state = NodeState { node: "n".into(), netns };
        Arc::new(DesiredState {
            term: 1,
            sequence,
            version: kuport_proto::canonical_version(&state),
            state: Some(state),
        })
    }

    /// A namespace of 200 sysctls and `content`, canonical: a change to `content` is a delta
    /// smaller than the whole.
    fn big(path: &str, content: &str) -> NetnsState {
        let mut ns = ns(path, content);
        ns.sysctls.extend((0..200).map(|i| kuport_proto::v1::Sysctl { key: format!("k{i}"), value: "1".into() }));
        kuport_proto::canonical::canonicalize_netns_whole(&mut ns);
        ns
    }

    fn sent_netns(ds: &DesiredState) -> &NetnsState {
        &ds.state.as_ref().expect("state").netns[0]
    }

    /// An answer; a refusal asks for the state whole, as one of a stub or delta would.
    fn ack(ds: &DesiredState, ok: bool) -> Ack {
        let errors = match ok {
            true => Vec::new(),
            false => vec![kuport_proto::v1::ObjectError {
                object: "network namespace \"/a\"".into(),
                reason: format!("version x is not held here: {}", kuport_proto::delta::SEND_WHOLE),
            }],
        };
        Ack { term: ds.term, sequence: ds.sequence, version: ds.version.clone(), ok, errors }
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

    #[test]
    fn a_namespace_held_at_another_version_goes_as_a_delta_from_it() {
        let mut h = Held::default();
        let (a0, a1, a2) = (big("/a", "x"), big("/a", "y"), big("/a", "z"));
        let s1 = state(1, vec![a0.clone()]);
        assert!(sent_netns(&h.outgoing(&s1)).delta.is_none(), "nothing acknowledged yet");
        assert!(!h.answered(&ack(&s1, true)));
        let s2 = state(2, vec![a1.clone()]);
        let sent = h.outgoing(&s2);
        let delta = sent_netns(&sent);
        assert!(delta.encoded_len() * 4 < a1.encoded_len(), "{} of {} bytes", delta.encoded_len(), a1.encoded_len());
        assert_eq!(kuport_proto::delta::apply(&a0, delta.clone()).as_ref(), Ok(&a1));
        // A state sent while s2 is in flight: the executor may hold a0 or a1, so no delta.
        let s3 = state(3, vec![a2.clone()]);
        assert!(sent_netns(&h.outgoing(&s3)).delta.is_none());
        assert!(!h.answered(&ack(&s2, true)));
        assert!(!h.answered(&ack(&s3, false)), "s3 went whole: nothing to send again");
        // After a2 is held, a refused delta asks for the state again, which goes whole.
        let s4 = state(4, vec![a1.clone()]);
        h.outgoing(&s4);
        let s5 = state(5, vec![a2.clone()]);
        assert!(!h.answered(&ack(&s4, true)));
        assert!(sent_netns(&h.outgoing(&s5)).delta.is_some());
        let mut by_kernel = ack(&s5, false);
        by_kernel.errors[0].reason = "route 10.0.0.0/8: File exists".into();
        assert!(!h.clone().answered(&by_kernel), "refused by the kernel: not sent again");
        assert!(h.answered(&ack(&s5, false)), "refused as a delta: sent again");
        let again = h.outgoing(&state(6, vec![a2]));
        assert!(sent_netns(&again).delta.is_none() && !sent_netns(&again).held, "whole");
    }

    #[test]
    fn the_state_an_executor_says_it_applied_goes_as_stubs_first() {
        let (a, b) = (big("/a", "x"), big("/b", "y"));
        let s1 = state(1, vec![a.clone(), b.clone()]);
        let mut h = Held::claiming(Some(s1.version.clone()));
        let sent = h.outgoing(&s1);
        assert_eq!(held(&sent), [true, true], "held, by the executor's word");
        assert_eq!(sent.version, s1.version);
        assert!(h.answered(&ack(&s1, false)), "a false claim: sent again, whole");
        assert_eq!(held(&h.outgoing(&s1)), [false, false]);

        // Another version than the one claimed: whole, and the claim is spent.
        let mut h = Held::claiming(Some("another".into()));
        assert_eq!(held(&h.outgoing(&s1)), [false, false]);
        let mut h = Held::claiming(Some(s1.version.clone()));
        h.outgoing(&state(2, vec![a.clone()]));
        assert_eq!(held(&h.outgoing(&s1)), [false, false], "only the first state sent");
    }
}
