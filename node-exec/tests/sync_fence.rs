//! Version fencing against a fake controller (no root needed): an executor applies a state only
//! when its (term, sequence) is newer than everything it saw; stale and reordered states are
//! ignored, a new leader's term wins, and NotLeader sends the executor to the leader.

#[path = "common/fake.rs"]
mod fake;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake::{acks, start};

use kuport_node_exec::sync::{Config, NodeApplier, run};
use kuport_proto::v1::{
    ControllerMessage, DesiredState, NodeState, NotLeader, ObjectError, controller_message, executor_message,
};

/// Records every state it is asked to apply; refuses those whose node name is "refuse".
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl NodeApplier for Recorder {
    async fn apply(&mut self, state: NodeState) -> Result<(), Vec<ObjectError>> {
        self.0.lock().expect("recorder").push(state.node.clone());
        if state.node == "refuse" {
            return Err(vec![ObjectError { object: "link kup-x".into(), reason: "Invalid argument".into() }]);
        }
        Ok(())
    }

    fn drift(&self) -> (u64, Vec<String>) {
        (0, Vec::new())
    }
}

fn state(term: u64, sequence: u64, label: &str) -> ControllerMessage {
    ControllerMessage {
        message: Some(controller_message::Message::State(DesiredState {
            term,
            sequence,
            version: format!("{label}@{term}.{sequence}"),
            state: Some(NodeState { node: label.into(), netns: vec![] }),
        })),
    }
}

#[tokio::test]
async fn stale_and_reordered_states_are_never_applied() {
    let (address, mut seen) = start(vec![
        state(5, 2, "a"),
        state(5, 1, "stale-sequence"),
        state(4, 9, "old-leader"),
        state(5, 2, "repeat"),
        state(5, 2, "a"),
        state(5, 3, "refuse"),
        state(5, 2, "older-than-refused"),
        state(6, 1, "new-leader"),
    ])
    .await;
    let recorder = Recorder::default();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let exec = tokio::spawn(run(Config::new(format!("http://{address}"), "n1"), recorder.clone(), async {
        let _ = stop_rx.await;
    }));
    let acks = acks(&mut seen, 4, Duration::from_secs(5)).await;
    let _ = stop_tx.send(());
    let _ = exec.await;

    let applied = recorder.0.lock().expect("recorder").clone();
    assert_eq!(applied, ["a", "refuse", "new-leader"], "only newer states reach the applier");
    let summary: Vec<(String, bool)> = acks.iter().map(|a| (a.version.clone(), a.ok)).collect();
    // The exact state already applied, sent again (a reconnect), is acknowledged, not applied.
    assert_eq!(
        summary,
        [
            ("a@5.2".to_string(), true),
            ("a@5.2".to_string(), true),
            ("refuse@5.3".to_string(), false),
            ("new-leader@6.1".to_string(), true)
        ]
    );
    assert_eq!(acks[2].errors[0].object, "link kup-x", "a refusal names the object");
}

/// A stored state the applier refuses at start is not claimed as applied: the hello names no
/// version, and the same state sent again is applied, not merely acknowledged.
#[tokio::test]
async fn a_stored_state_refused_at_start_is_not_claimed_and_is_applied_again() {
    let dir = std::env::temp_dir().join(format!("kuport-fence-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("state dir");
    let stored = DesiredState {
        term: 5,
        sequence: 2,
        version: "refuse@5.2".into(),
        state: Some(NodeState { node: "refuse".into(), netns: vec![] }),
    };
    kuport_node_exec::sync::store::save(&dir, &stored).expect("store");
    let (address, mut seen) = start(vec![state(5, 2, "again"), state(5, 1, "older")]).await;
    let recorder = Recorder::default();
    let mut cfg = Config::new(format!("http://{address}"), "n1");
    cfg.state_dir = Some(dir.clone());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let exec = tokio::spawn(run(cfg, recorder.clone(), async {
        let _ = stop_rx.await;
    }));
    let hello = tokio::time::timeout(Duration::from_secs(5), seen.recv()).await.expect("hello in time").expect("hello");
    let got = acks(&mut seen, 1, Duration::from_secs(5)).await;
    let _ = stop_tx.send(());
    let _ = exec.await;
    let _ = std::fs::remove_dir_all(&dir);
    let Some(executor_message::Message::Hello(h)) = hello.message else { panic!("first message: {hello:?}") };
    assert_eq!(h.applied, None, "a refused stored state is not claimed");
    assert_eq!(
        recorder.0.lock().expect("recorder").as_slice(),
        ["refuse", "again"],
        "refused at start, applied when sent"
    );
    assert_eq!(got.iter().map(|a| (a.version.as_str(), a.ok)).collect::<Vec<_>>(), [("again@5.2", true)]);
}

#[tokio::test]
async fn the_first_message_is_hello_and_not_leader_redirects() {
    // The leader: one state.
    let (leader, mut leader_seen) = start(vec![state(1, 1, "from-leader")]).await;
    // A follower that names the leader.
    let (follower, mut follower_seen) = start(vec![ControllerMessage {
        message: Some(controller_message::Message::NotLeader(NotLeader { leader: leader.clone() })),
    }])
    .await;
    let recorder = Recorder::default();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let exec = tokio::spawn(run(Config::new(format!("http://{follower}"), "n1"), recorder.clone(), async {
        let _ = stop_rx.await;
    }));
    let got = acks(&mut leader_seen, 1, Duration::from_secs(5)).await;
    let _ = stop_tx.send(());
    let _ = exec.await;
    assert_eq!(got.len(), 1, "the executor followed the redirect and acked the leader's state");
    let hello = follower_seen.try_recv().expect("the follower saw a message");
    let Some(executor_message::Message::Hello(h)) = hello.message else { panic!("first message: {hello:?}") };
    assert_eq!(h.node, "n1");
    assert_eq!(recorder.0.lock().expect("recorder").as_slice(), ["from-leader"]);
}
