//! The NodeSync service: one stream per executor. The first message must be Hello; then the
//! node's desired state goes down whenever it changes (the namespaces the executor holds as
//! stubs, see [`Held`]), and acks, facts and drift come up.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kuport_proto::v1::node_sync_server::NodeSync;
use kuport_proto::v1::{
    ControllerMessage, DesiredState, ExecutorMessage, NotLeader, controller_message, executor_message,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::held::Held;
use super::hub::Hub;
use super::leader::Leadership;

/// How long a new stream may take to say Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A Node name is a DNS subdomain: at most 253 bytes.
const MAX_NODE_NAME: usize = 253;

pub struct SyncService {
    hub: Arc<Hub>,
}

impl SyncService {
    pub fn new(hub: Arc<Hub>) -> Self {
        SyncService { hub }
    }
}

type Out = Result<ControllerMessage, Status>;

fn state(ds: DesiredState) -> Out {
    Ok(ControllerMessage { message: Some(controller_message::Message::State(ds)) })
}

fn not_leader(leader: String) -> Out {
    Ok(ControllerMessage { message: Some(controller_message::Message::NotLeader(NotLeader { leader })) })
}

/// NotLeader for a replica that does not lead (now): a lapsed leader that has not stepped
/// down yet names itself, so it names no one.
fn redirect(lead: &Leadership) -> Out {
    not_leader(if lead.leader { String::new() } else { lead.leader_address.clone() })
}

/// Sends `ds` while this replica leads, else NotLeader: `leader` may not have caught up with
/// a lapsed lease yet (a replica resuming from a freeze publishes before it). False: the
/// stream ends.
async fn send(
    tx: &mpsc::Sender<Out>,
    leadership: &watch::Receiver<Leadership>,
    held: &mut Held,
    ds: Option<Arc<DesiredState>>,
) -> bool {
    let Some(ds) = ds else { return true };
    let lead = leadership.borrow().clone();
    if !lead.leads() {
        let _ = tx.send(redirect(&lead)).await;
        return false;
    }
    tx.send(state(held.outgoing(&ds))).await.is_ok()
}

#[tonic::async_trait]
impl NodeSync for SyncService {
    type SyncStream = Pin<Box<dyn Stream<Item = Out> + Send + 'static>>;

    async fn sync(&self, request: Request<Streaming<ExecutorMessage>>) -> Result<Response<Self::SyncStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel::<Out>(2);
        let mut leadership = self.hub.leadership();
        let lead = leadership.borrow_and_update().clone();
        if !lead.leads() {
            let _ = tx.send(redirect(&lead)).await;
            return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
        }
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
        let hub = self.hub.clone();
        // The only node this stream speaks for: every message after Hello is taken as this
        // node's (a second Hello is ignored), see [`Hub::receive`].
        let node = hello.node.clone();
        let (session, mut desired) = hub.connect(&hello);
        let mut closing = hub.closing();
        tracing::info!(%node, session, version = %hello.executor_version, "executor connected");
        tokio::spawn(async move {
            let mut held = Held::default();
            let current = desired.borrow_and_update().clone();
            let mut alive = !*closing.borrow() && send(&tx, &leadership, &mut held, current).await;
            while alive {
                tokio::select! {
                    changed = desired.changed() => {
                        let current = desired.borrow_and_update().clone();
                        alive = changed.is_ok() && send(&tx, &leadership, &mut held, current).await;
                    }
                    msg = inbound.message() => match msg {
                        Ok(Some(m)) => {
                            if let Some(executor_message::Message::Ack(a)) = &m.message {
                                held.answered(a);
                            }
                            hub.receive(&node, m);
                        }
                        Ok(None) => alive = false,
                        Err(e) => {
                            tracing::info!(%node, error = %e, "executor stream failed");
                            alive = false;
                        }
                    },
                    changed = leadership.changed() => {
                        let lead = leadership.borrow_and_update().clone();
                        if changed.is_err() || !lead.leads() {
                            let _ = tx.send(redirect(&lead)).await;
                            alive = false;
                        }
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
