//! A scripted NodeSync controller for the executor's tests.

use std::pin::Pin;
use std::time::Duration;

use kuport_proto::v1::node_sync_server::{NodeSync, NodeSyncServer};
use kuport_proto::v1::{Ack, ControllerMessage, ExecutorMessage, executor_message};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

#[allow(dead_code)]
/// A scripted controller: answers Hello with `script`, forwards every executor message.
struct Fake {
    script: Vec<ControllerMessage>,
    seen: mpsc::UnboundedSender<ExecutorMessage>,
}

#[tonic::async_trait]
impl NodeSync for Fake {
    type SyncStream = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

    async fn sync(&self, request: Request<Streaming<ExecutorMessage>>) -> Result<Response<Self::SyncStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let script = self.script.clone();
        let seen = self.seen.clone();
        tokio::spawn(async move {
            // Wait for Hello before sending, like the real controller.
            if let Ok(Some(m)) = inbound.message().await {
                let _ = seen.send(m);
            }
            for m in script {
                if tx.send(Ok(m)).await.is_err() {
                    return;
                }
            }
            while let Ok(Some(m)) = inbound.message().await {
                let _ = seen.send(m);
            }
            drop(tx);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

pub async fn start(script: Vec<ControllerMessage>) -> (String, mpsc::UnboundedReceiver<ExecutorMessage>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let (seen, rx) = mpsc::unbounded_channel();
    let svc = NodeSyncServer::new(Fake { script, seen })
        .max_decoding_message_size(kuport_node_exec::sync::client::MAX_MESSAGE)
        .max_encoding_message_size(kuport_node_exec::sync::client::MAX_MESSAGE);
    tokio::spawn(
        tonic::transport::Server::builder().add_service(svc).serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (address, rx)
}

/// Collects the executor's acks until `n` arrived (or `within` passed).
pub async fn acks(rx: &mut mpsc::UnboundedReceiver<ExecutorMessage>, n: usize, within: Duration) -> Vec<Ack> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    while out.len() < n {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(ExecutorMessage { message: Some(executor_message::Message::Ack(a)) })) => out.push(a),
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    out
}
