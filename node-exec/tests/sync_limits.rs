//! What the executor decodes (docs/design.md, "What the executor refuses"), against a fake
//! controller (no root needed): a state larger than it decodes, or one that does not decode,
//! is refused with a NACK that says why, and the state applied before is kept.

#[path = "common/fake.rs"]
mod fake;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kuport_node_exec::sync::{Config, NodeApplier, run};
use kuport_proto::channel::MAX_STATE_MESSAGE;
use kuport_proto::v1::{
    Ack, ControllerMessage, DesiredState, NetnsState, NodeState, ObjectError, Sysctl, controller_message,
};
use prost::Message as _;
use tonic::codegen::Bytes;

/// Records the node name of every state it is asked to apply.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl NodeApplier for Recorder {
    async fn apply(&mut self, state: NodeState) -> Result<(), Vec<ObjectError>> {
        self.0.lock().expect("recorder").push(state.node.clone());
        Ok(())
    }

    fn drift(&self) -> (u64, Vec<String>) {
        (0, Vec::new())
    }
}

fn message(sequence: u64, state: NodeState) -> ControllerMessage {
    let ds = DesiredState { term: 1, sequence, version: format!("{}@1.{sequence}", state.node), state: Some(state) };
    ControllerMessage { message: Some(controller_message::Message::State(ds)) }
}

/// A state `bytes` long on the wire: one sysctl value fills it.
fn sized(sequence: u64, bytes: usize) -> ControllerMessage {
    let value = "1".repeat(bytes);
    let ns = NetnsState {
        sysctls: vec![Sysctl { key: kuport_proto::owned::SYSCTL_FORWARDING.into(), value }],
        ..Default::default()
    };
    message(sequence, NodeState { node: "big".into(), netns: vec![ns] })
}

async fn executor_against(address: String, recorder: Recorder, n: usize, seen: &mut fake::Seen) -> Vec<Ack> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut cfg = Config::new(format!("http://{address}"), "n1");
    cfg.backoff_initial = Duration::from_millis(50);
    let exec = tokio::spawn(run(cfg, recorder, async {
        let _ = stop_rx.await;
    }));
    let acks = fake::acks(seen, n, Duration::from_secs(20)).await;
    let _ = stop_tx.send(());
    let _ = exec.await;
    acks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_state_is_refused_by_its_size_and_the_last_one_kept() {
    let first = message(1, NodeState { node: "first".into(), netns: vec![] });
    let big = sized(2, MAX_STATE_MESSAGE + 1);
    assert!(big.encoded_len() > MAX_STATE_MESSAGE);
    let (address, mut seen) = fake::start(vec![first, big]).await;
    let recorder = Recorder::default();
    let acks = executor_against(address, recorder.clone(), 2, &mut seen).await;
    assert_eq!(acks.len(), 2, "{acks:?}");
    assert!(acks[0].ok && acks[0].version == "first@1.1", "{:?}", acks[0]);
    let nack = &acks[1];
    assert!(!nack.ok, "{nack:?}");
    let reason = &nack.errors[0].reason;
    assert!(
        reason.contains("larger than the executor decodes") && reason.contains(&MAX_STATE_MESSAGE.to_string()),
        "{reason}"
    );
    assert_eq!(*recorder.0.lock().expect("recorder"), ["first"], "the oversize state never reached the applier");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_at_the_limit_is_applied() {
    // The sysctl's value fills the message up to exactly the limit.
    let mut bytes = MAX_STATE_MESSAGE - 64;
    for _ in 0..3 {
        bytes += MAX_STATE_MESSAGE - sized(1, bytes).encoded_len();
    }
    let at = sized(1, bytes);
    assert_eq!(at.encoded_len(), MAX_STATE_MESSAGE);
    let (address, mut seen) = fake::start(vec![at]).await;
    let acks = executor_against(address, Recorder::default(), 1, &mut seen).await;
    assert!(acks.len() == 1 && acks[0].ok, "{acks:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_state_is_refused_by_name_and_the_stream_goes_on() {
    let encode = |m: ControllerMessage| Bytes::from(m.encode_to_vec());
    let first = encode(message(1, NodeState { node: "first".into(), netns: vec![] }));
    // State 2 whose NodeState's node name is no UTF-8: term, sequence and version still read.
    let mut bad = message(2, NodeState::default()).encode_to_vec();
    let node = [0x22u8, 0x04, 0x0a, 0x02, 0xff, 0xfe];
    bad[1] += node.len() as u8;
    bad.extend(node);
    let third = encode(message(3, NodeState { node: "third".into(), netns: vec![] }));
    let (address, mut seen) = fake::start_raw(vec![first, Bytes::from(bad), third]).await;
    let recorder = Recorder::default();
    let acks = executor_against(address, recorder.clone(), 3, &mut seen).await;
    let summary: Vec<(u64, bool)> = acks.iter().map(|a| (a.sequence, a.ok)).collect();
    assert_eq!(summary, [(1, true), (2, false), (3, true)], "{acks:?}");
    assert_eq!(acks[1].version, "@1.2");
    assert!(acks[1].errors[0].reason.contains("does not decode"), "{:?}", acks[1].errors);
    assert_eq!(*recorder.0.lock().expect("recorder"), ["first", "third"]);
}
