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

/// What the fake sends and accepts at most.
pub const FAKE_MAX_MESSAGE: usize = 256 * 1024 * 1024;

/// One fake stream: waits for Hello (like the real controller), sends `script`, then forwards
/// every executor message to `seen` until the executor hangs up.
#[allow(dead_code)]
fn replay<T: Send + 'static>(
    mut inbound: Streaming<ExecutorMessage>,
    script: Vec<T>,
    seen: mpsc::UnboundedSender<ExecutorMessage>,
) -> ReceiverStream<Result<T, Status>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
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
    });
    ReceiverStream::new(rx)
}

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
        let rx = replay(request.into_inner(), self.script.clone(), self.seen.clone());
        Ok(Response::new(Box::pin(rx)))
    }
}

pub async fn start(script: Vec<ControllerMessage>) -> (String, mpsc::UnboundedReceiver<ExecutorMessage>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let (seen, rx) = mpsc::unbounded_channel();
    // Larger than the executor's limits: a test may send what the executor must refuse.
    let svc = NodeSyncServer::new(Fake { script, seen })
        .max_decoding_message_size(FAKE_MAX_MESSAGE)
        .max_encoding_message_size(FAKE_MAX_MESSAGE);
    tokio::spawn(
        tonic::transport::Server::builder().add_service(svc).serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (address, rx)
}

/// What the executor sent the fake.
#[allow(dead_code)]
pub type Seen = mpsc::UnboundedReceiver<ExecutorMessage>;

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

/// Controller messages as bytes, sent as they are (a test's undecodable ones too); executor
/// messages decoded.
#[derive(Clone, Copy, Default)]
struct RawOutbound;

struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = tonic::codegen::Bytes;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), Status> {
        bytes_put(dst, &item);
        Ok(())
    }
}

fn bytes_put(dst: &mut tonic::codec::EncodeBuf<'_>, item: &[u8]) {
    use prost::bytes::BufMut as _;
    dst.put_slice(item);
}

impl tonic::codec::Codec for RawOutbound {
    type Encode = tonic::codegen::Bytes;
    type Decode = ExecutorMessage;
    type Encoder = RawEncoder;
    type Decoder = tonic_prost::ProstDecoder<ExecutorMessage>;

    fn encoder(&mut self) -> Self::Encoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(Default::default())
    }
}

/// The Sync method of [`RawFake`]: answers Hello with the script, forwards every message.
struct RawSync {
    script: Vec<tonic::codegen::Bytes>,
    seen: mpsc::UnboundedSender<ExecutorMessage>,
}

impl tonic::server::StreamingService<ExecutorMessage> for RawSync {
    type Response = tonic::codegen::Bytes;
    type ResponseStream = ReceiverStream<Result<tonic::codegen::Bytes, Status>>;
    type Future = std::future::Ready<Result<Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: Request<Streaming<ExecutorMessage>>) -> Self::Future {
        let rx = replay(request.into_inner(), self.script.clone(), self.seen.clone());
        std::future::ready(Ok(Response::new(rx)))
    }
}

/// A scripted NodeSync controller that sends raw bytes as its messages.
#[derive(Clone)]
struct RawFake {
    script: Vec<tonic::codegen::Bytes>,
    seen: mpsc::UnboundedSender<ExecutorMessage>,
}

impl tonic::server::NamedService for RawFake {
    const NAME: &'static str = "kuport.v1.NodeSync";
}

impl tower::Service<tonic::codegen::http::Request<tonic::body::Body>> for RawFake {
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::codegen::http::Request<tonic::body::Body>) -> Self::Future {
        let svc = RawSync { script: self.script.clone(), seen: self.seen.clone() };
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(RawOutbound)
                .apply_max_message_size_config(Some(FAKE_MAX_MESSAGE), Some(FAKE_MAX_MESSAGE));
            Ok(grpc.streaming(svc, req).await)
        })
    }
}

/// [`start`] with each message as raw bytes (one that decodes to no ControllerMessage too).
#[allow(dead_code)]
pub async fn start_raw(script: Vec<tonic::codegen::Bytes>) -> (String, mpsc::UnboundedReceiver<ExecutorMessage>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let (seen, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RawFake { script, seen })
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (address, rx)
}
