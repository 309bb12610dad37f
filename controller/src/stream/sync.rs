//! The NodeSync service: one stream per executor. The first message must be Hello; then the
//! node's desired state goes down whenever it changes (the namespaces the executor holds as
//! stubs, see [`Held`]), and acks, facts, drift and peer reports come up. A new leader's first
//! state may wait for the executor's first peer report, at most
//! [`FIRST_STATE_HOLD`](super::hub::FIRST_STATE_HOLD) (docs/overlay/status.md, "A new leader"). With [`Executors`], the leader
//! proves the stream's bearer token before reading Hello and takes Hello only for the node the
//! token proves; the stream ends when the token expires (docs/security.md).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kuport_proto::v1::node_sync_server::NodeSync;
use kuport_proto::v1::{
    ControllerMessage, DesiredState, ExecutorMessage, NotLeader, ReadCounters, controller_message, executor_message,
};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::held::Held;
use super::hub::Hub;
use super::leader::Leadership;
use crate::trust::identity::{Code, Executors, Proven, Refusal, reason};

/// How long a new stream may take to say Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A Node name is a DNS subdomain: at most 253 bytes.
const MAX_NODE_NAME: usize = 253;

pub struct SyncService {
    hub: Arc<Hub>,
    /// None: the insecure folder mode, every Hello is believed.
    executors: Option<Arc<Executors>>,
}

impl SyncService {
    pub fn new(hub: Arc<Hub>, executors: Option<Arc<Executors>>) -> Self {
        SyncService { hub, executors }
    }

    /// Logs and counts a refused stream.
    fn refuse(&self, refusal: Refusal, peer: Option<std::net::SocketAddr>, claimed: &str, proven: &str) -> Status {
        self.hub.metrics().executor_refused(refusal.reason);
        let peer = peer.map(|p| p.to_string()).unwrap_or_default();
        tracing::warn!(reason = refusal.reason, detail = %refusal.detail, claimed, proven, %peer, "executor refused");
        refusal.into()
    }
}

type Out = Result<ControllerMessage, Status>;

fn state(ds: DesiredState) -> Out {
    Ok(ControllerMessage { message: Some(controller_message::Message::State(ds)) })
}

fn not_leader(leader: String) -> Out {
    Ok(ControllerMessage { message: Some(controller_message::Message::NotLeader(NotLeader { leader })) })
}

fn read_counters(id: u64) -> Out {
    Ok(ControllerMessage { message: Some(controller_message::Message::ReadCounters(ReadCounters { id })) })
}

/// NotLeader for a replica that does not lead (now): a lapsed leader that has not stepped
/// down yet names itself, so it names no one.
fn redirect(lead: &Leadership) -> Out {
    not_leader(if lead.leader { String::new() } else { lead.leader_address.clone() })
}

/// Sends `ds` while this replica leads, else NotLeader: `leader` may not have caught up with
/// a lapsed lease yet (a replica resuming from a freeze publishes before it). False: the
/// stream ends. Counts the namespaces sent as deltas in `deltas`.
async fn send(
    tx: &mpsc::Sender<Out>,
    leadership: &watch::Receiver<Leadership>,
    held: &mut Held,
    deltas: &Counter,
    ds: Option<Arc<DesiredState>>,
) -> bool {
    let Some(ds) = ds else { return true };
    let lead = leadership.borrow().clone();
    if !lead.leads() {
        let _ = tx.send(redirect(&lead)).await;
        return false;
    }
    let out = held.outgoing(&ds);
    deltas.inc_by(out.state.iter().flat_map(|s| &s.netns).filter(|ns| ns.delta.is_some()).count() as u64);
    tx.send(state(out)).await.is_ok()
}

#[tonic::async_trait]
impl NodeSync for SyncService {
    type SyncStream = Pin<Box<dyn Stream<Item = Out> + Send + 'static>>;

    async fn sync(&self, request: Request<Streaming<ExecutorMessage>>) -> Result<Response<Self::SyncStream>, Status> {
        let peer = request.remote_addr();
        let (tx, rx) = mpsc::channel::<Out>(2);
        let mut leadership = self.hub.leadership();
        let lead = leadership.borrow_and_update().clone();
        if !lead.leads() {
            let _ = tx.send(redirect(&lead)).await;
            return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
        }
        // Before reading Hello: an unproven stream is not read at all.
        let proven: Option<Proven> = match &self.executors {
            None => None,
            Some(ex) => match ex.prove(request.metadata()).await {
                Ok(p) => Some(p),
                Err(r) => return Err(self.refuse(r, peer, "", "")),
            },
        };
        let mut inbound = request.into_inner();
        let hello = match tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await {
            Ok(Ok(Some(ExecutorMessage { message: Some(executor_message::Message::Hello(h)) }))) => h,
            Ok(Err(status)) => return Err(status),
            Err(_) => return Err(Status::deadline_exceeded("no Hello within 10 s")),
            Ok(_) => return Err(Status::invalid_argument("the first message must be Hello")),
        };
        if hello.node.is_empty() || hello.node.len() > MAX_NODE_NAME {
            return Err(Status::invalid_argument(format!(
                "Hello.node: must name the executor's node (1 to {MAX_NODE_NAME} bytes)"
            )));
        }
        if let Some(p) = proven.as_ref().filter(|p| p.node != hello.node) {
            let detail = format!("Hello names node {:?}, the token proves node {:?}", hello.node, p.node);
            let refusal = Refusal::new(Code::PermissionDenied, reason::WRONG_NODE, detail);
            return Err(self.refuse(refusal, peer, &hello.node, &p.node));
        }
        // The stream ends when its token expires: the executor reconnects with its refreshed one.
        let expires = proven.as_ref().and_then(|p| p.expires).map(|e| {
            let left = e.duration_since(std::time::SystemTime::now()).unwrap_or(Duration::ZERO);
            tokio::time::Instant::now() + left
        });
        let hub = self.hub.clone();
        // The only node this stream speaks for: every message after Hello is taken as this
        // node's (a second Hello is ignored), see [`Hub::receive`].
        let node = hello.node.clone();
        let super::hub::Session { id: session, mut desired, mut newest, mut held, hold_until, mut counters_asked } =
            hub.connect_from(&hello, peer);
        let mut closing = hub.closing();
        let proven_node = proven.as_ref().map(|p| p.node.as_str()).unwrap_or("(insecure: not proven)");
        tracing::info!(claimed = %node, proven = proven_node, session, version = %hello.executor_version, "executor connected");
        tokio::spawn(async move {
            let mut held_stubs = Held::claiming(hello.applied.as_ref().map(|a| a.version.clone()));
            let deltas = hub.metrics().deltas_sent.clone();
            // The first state of a new term may wait for the executor's peer report
            // (docs/overlay/status.md, "A new leader"); messages are read meanwhile.
            let mut waiting = *held.borrow_and_update();
            let current = desired.borrow_and_update().clone();
            let mut alive =
                !*closing.borrow() && (waiting || send(&tx, &leadership, &mut held_stubs, &deltas, current).await);
            while alive {
                tokio::select! {
                    changed = desired.changed() => {
                        let current = desired.borrow_and_update().clone();
                        alive = changed.is_ok() && (waiting || send(&tx, &leadership, &mut held_stubs, &deltas, current).await);
                    }
                    changed = held.changed(), if waiting => {
                        waiting = changed.is_ok() && *held.borrow_and_update();
                        if !waiting {
                            let current = desired.borrow_and_update().clone();
                            alive = send(&tx, &leadership, &mut held_stubs, &deltas, current).await;
                        }
                    }
                    _ = tokio::time::sleep_until(hold_until.map_or_else(tokio::time::Instant::now, Into::into)), if waiting => {
                        hub.release_hold(&node, session);
                        waiting = false;
                        let _ = held.borrow_and_update();
                        let current = desired.borrow_and_update().clone();
                        alive = send(&tx, &leadership, &mut held_stubs, &deltas, current).await;
                    }
                    msg = inbound.message() => match msg {
                        Ok(Some(m)) => {
                            if let Some(executor_message::Message::Ack(a)) = &m.message
                                && held_stubs.answered(a)
                            {
                                // Published again: `desired` changes, and it goes whole.
                                hub.resend(&node, session);
                            }
                            // Dropped if a newer stream took over; it ends below.
                            hub.receive_from(&node, session, m);
                        }
                        Ok(None) => alive = false,
                        Err(e) => {
                            tracing::info!(%node, error = %e, "executor stream failed");
                            alive = false;
                        }
                    },
                    changed = counters_asked.changed() => {
                        let id = *counters_asked.borrow_and_update();
                        alive = changed.is_ok() && tx.send(read_counters(id)).await.is_ok();
                    }
                    changed = leadership.changed() => {
                        let lead = leadership.borrow_and_update().clone();
                        if changed.is_err() || !lead.leads() {
                            let _ = tx.send(redirect(&lead)).await;
                            alive = false;
                        }
                    }
                    changed = newest.changed() => {
                        // A newer stream said Hello for this node: it alone speaks for it now.
                        let by = *newest.borrow_and_update();
                        if changed.is_err() || by != session {
                            tracing::warn!(%node, session, newer = by, "executor stream superseded by a newer one");
                            let _ = tx
                                .send(Err(Status::aborted(format!("superseded by a newer stream for node {node}"))))
                                .await;
                            alive = false;
                        }
                    }
                    _ = tokio::time::sleep_until(expires.unwrap_or_else(tokio::time::Instant::now)), if expires.is_some() => {
                        tracing::info!(%node, session, "executor token expired: ending the stream");
                        let _ = tx
                            .send(Err(Status::unauthenticated(format!(
                                "{}: the token expired; reconnect with the refreshed token",
                                reason::INVALID_TOKEN
                            ))))
                            .await;
                        alive = false;
                    }
                    _ = tx.closed() => alive = false,
                    c = closing.changed() => alive = c.is_ok() && !*closing.borrow(),
                }
            }
            hub.disconnect(&node, session);
            tracing::info!(%node, session, "executor disconnected");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trust::identity::tests::{FakeReviewer, executor, jwt, now_secs};
    use kuport_proto::v1::Hello;
    use kuport_proto::v1::node_sync_client::NodeSyncClient;
    use std::sync::atomic::Ordering;
    use tonic::transport::Channel;

    struct Server {
        hub: Arc<Hub>,
        fake: Arc<FakeReviewer>,
        client: NodeSyncClient<Channel>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        _lead: watch::Sender<Leadership>,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            if let Some(s) = self.stop.take() {
                let _ = s.send(());
            }
        }
    }

    /// A standalone hub on the examples, serving NodeSync with executors proven by a fake reviewer.
    async fn server() -> Server {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
        let cluster = crate::render::load_dir(&dir, k8s_openapi::jiff::Timestamp::now()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (lead, rx) = super::super::leader::standalone(address.clone());
        let hub = Hub::new(crate::compute::Settings::default(), rx, true);
        hub.set_inputs(cluster);
        hub.recompute();
        let fake = Arc::new(FakeReviewer::default());
        let executors = Executors::new(fake.clone(), crate::trust::EXECUTOR_AUDIENCE, "kuport-system:kuport-node-exec")
            .counting(hub.metrics().token_reviews.clone());
        let trust = crate::serve::Trust { executors: Some(Arc::new(executors)), ..Default::default() };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(crate::serve::serve_grpc(hub.clone(), listener, trust, async {
            let _ = stopped.await;
        }));
        let client = loop {
            if let Ok(c) = NodeSyncClient::connect(format!("http://{address}")).await {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Server { hub, fake, client, stop: Some(stop), _lead: lead }
    }

    /// Opens a stream with `token` that says Hello for `node`.
    async fn open(
        client: &mut NodeSyncClient<Channel>,
        token: Option<&str>,
        node: &str,
    ) -> (mpsc::Sender<ExecutorMessage>, Result<Streaming<ControllerMessage>, Status>) {
        open_with(client, token, Hello { node: node.into(), executor_version: "test".into(), applied: None }).await
    }

    async fn open_with(
        client: &mut NodeSyncClient<Channel>,
        token: Option<&str>,
        hello: Hello,
    ) -> (mpsc::Sender<ExecutorMessage>, Result<Streaming<ControllerMessage>, Status>) {
        let (tx, rx) = mpsc::channel(8);
        tx.send(ExecutorMessage { message: Some(executor_message::Message::Hello(hello)) }).await.unwrap();
        let mut request = Request::new(ReceiverStream::new(rx));
        if let Some(t) = token {
            kuport_proto::channel::authorize(&mut request, t).unwrap();
        }
        let answer = client.sync(request).await.map(Response::into_inner);
        (tx, answer)
    }

    fn refusals(hub: &Hub, reason: &str) -> bool {
        hub.metrics().render(hub).contains(&format!("kuport_executor_refusals_total{{reason=\"{reason}\"}} 1"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_speaks_only_for_the_node_its_token_proves() {
        let mut s = server().await;
        let token = jwt(crate::trust::EXECUTOR_AUDIENCE, now_secs() + 3600, "w1");
        s.fake.add(&token, executor("worker-1"));

        let (_tx, refused) = open(&mut s.client, Some(&token), "worker-2").await;
        let status = refused.unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert_eq!(status.message(), "wrong_node: Hello names node \"worker-2\", the token proves node \"worker-1\"");
        assert!(refusals(&s.hub, reason::WRONG_NODE));
        assert!(!s.hub.node("worker-2").is_some_and(|n| n.connected), "no session for the claimed node");

        let (_tx, refused) = open(&mut s.client, None, "worker-1").await;
        assert_eq!(refused.unwrap_err().code(), tonic::Code::Unauthenticated);
        assert!(refusals(&s.hub, reason::NO_TOKEN));
        let (_tx, refused) = open(&mut s.client, Some("forged"), "worker-1").await;
        assert_eq!(refused.unwrap_err().code(), tonic::Code::Unauthenticated);
        assert!(refusals(&s.hub, reason::INVALID_TOKEN));

        // Its own node: the state comes down. Twice with one token: one review.
        for _ in 0..2 {
            let (_tx, accepted) = open(&mut s.client, Some(&token), "worker-1").await;
            let first = accepted.unwrap().message().await.unwrap().unwrap();
            assert!(matches!(first.message, Some(controller_message::Message::State(_))), "{first:?}");
        }
        // The wrong-node attempt was the first review of this token; the cache answered the rest.
        assert_eq!(s.fake.token_reviews.load(Ordering::SeqCst), 2, "the token once, the forged one once");
        assert_eq!(s.hub.metrics().token_reviews.get(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_ends_when_its_token_expires() {
        let mut s = server().await;
        let token = jwt(crate::trust::EXECUTOR_AUDIENCE, now_secs() + 2, "short");
        s.fake.add(&token, executor("worker-1"));
        let started = std::time::Instant::now();
        let (_tx, accepted) = open(&mut s.client, Some(&token), "worker-1").await;
        let mut inbound = accepted.unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match inbound.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return None,
                    Err(status) => return Some(status),
                }
            }
        })
        .await
        .expect("the stream ends")
        .expect("with a status");
        assert_eq!(ended.code(), tonic::Code::Unauthenticated, "{ended:?}");
        assert!(ended.message().contains("expired"), "{ended:?}");
        assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
        for _ in 0..100 {
            if !s.hub.node("worker-1").is_some_and(|n| n.connected) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("worker-1 still connected after its token expired");
    }

    async fn next_state(inbound: &mut Streaming<ControllerMessage>) -> DesiredState {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), inbound.message())
                .await
                .expect("a message in time")
                .expect("the stream")
                .expect("open");
            if let Some(controller_message::Message::State(ds)) = m.message {
                return ds;
            }
        }
    }

    /// An executor's answer; a refusal is the one of a delta from a version it does not hold.
    fn answer(ds: &DesiredState, ok: bool) -> ExecutorMessage {
        let errors = match ok {
            true => Vec::new(),
            false => vec![kuport_proto::v1::ObjectError {
                object: "network namespace \"host\"".into(),
                reason: format!("the delta applies to another version: {}", kuport_proto::delta::SEND_WHOLE),
            }],
        };
        let ack =
            kuport_proto::v1::Ack { term: ds.term, sequence: ds.sequence, version: ds.version.clone(), ok, errors };
        ExecutorMessage { message: Some(executor_message::Message::Ack(ack)) }
    }

    /// After an executor applied a state, a change goes as a delta from it that gives the new
    /// version; a refused delta is counted and the state goes again whole, under a new
    /// sequence the executor's fence admits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_goes_as_a_delta_and_whole_again_when_refused() {
        use prost::Message as _;
        let mut s = server().await;
        let (_, inputs) = s.hub.outputs();
        let before = crate::observe::Cluster::clone(&inputs.expect("inputs"));
        let version = |hub: &Hub, node: &str| hub.node(node).and_then(|n| n.desired).map(|d| d.version.clone());
        let nodes: Vec<String> = s.hub.outputs().0.node_states.keys().cloned().collect();
        let was: Vec<_> = nodes.iter().map(|n| version(&s.hub, n)).collect();
        // A PortMap whose removal changes a node's state.
        let (changed, node) = (0..before.port_maps.len())
            .find_map(|i| {
                let mut c = before.clone();
                let mut kept = c.port_maps.arcs().to_vec();
                kept.remove(i);
                c.port_maps = kept.into();
                s.hub.set_inputs(c.clone());
                s.hub.recompute();
                // One that keeps a namespace worth a delta.
                let big = |n: &str| {
                    let d = s.hub.node(n).and_then(|n| n.desired);
                    d.and_then(|d| Some(d.state.as_ref()?.netns.first()?.encoded_len() > 1024)).unwrap_or(false)
                };
                let node = nodes.iter().zip(&was).find(|(n, w)| version(&s.hub, n) != **w && big(n))?.0.clone();
                Some((c, node))
            })
            .expect("a PortMap that changes a node");
        s.hub.set_inputs(before);
        s.hub.recompute();
        let token = jwt(crate::trust::EXECUTOR_AUDIENCE, now_secs() + 3600, "t");
        s.fake.add(&token, executor(&node));
        let (tx, accepted) = open(&mut s.client, Some(&token), &node).await;
        let mut inbound = accepted.unwrap();
        let first = next_state(&mut inbound).await;
        tx.send(answer(&first, true)).await.unwrap();
        // The session read the ack once the hub has it.
        for _ in 0..500 {
            if s.hub.node(&node).and_then(|n| n.acked).is_some_and(|a| a.version == first.version) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        s.hub.set_inputs(changed);
        s.hub.recompute();
        let second = next_state(&mut inbound).await;
        let host = |ds: &DesiredState| ds.state.as_ref().expect("a state").netns[0].clone();
        let delta = host(&second);
        assert!(delta.delta.is_some(), "{delta:?}");
        assert!(delta.encoded_len() < host(&first).encoded_len(), "smaller than the namespace");
        let whole = kuport_proto::delta::apply(&host(&first), delta).expect("the delta applies");
        let mut state = second.state.clone().expect("a state");
        state.netns[0] = whole;
        assert_eq!(kuport_proto::canonical_version(&state), second.version);

        tx.send(answer(&second, false)).await.unwrap();
        let third = next_state(&mut inbound).await;
        assert_eq!(third.version, second.version);
        assert!(third.sequence > second.sequence, "admitted by the executor's fence");
        assert!(third.state.iter().flat_map(|s| &s.netns).all(|ns| ns.delta.is_none() && !ns.held), "whole");
        assert_eq!(s.hub.metrics().deltas_refused.get(), 1);
        assert_eq!(s.hub.metrics().deltas_sent.get(), 1, "the one namespace sent as a delta");
        tx.send(answer(&third, true)).await.unwrap();

        // Reconnected, saying it applied that state: it goes as stubs, nothing resent.
        let applied = kuport_proto::v1::Applied { term: third.term, sequence: third.sequence, version: third.version };
        let hello = Hello { node: node.clone(), executor_version: "test".into(), applied: Some(applied) };
        let (_tx, accepted) = open_with(&mut s.client, Some(&token), hello).await;
        let again = next_state(&mut accepted.unwrap()).await;
        assert!(again.state.iter().flat_map(|s| &s.netns).all(|ns| ns.held), "{again:?}");
    }
}
