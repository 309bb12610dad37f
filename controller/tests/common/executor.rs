//! Fake executors over the real NodeSync service, and a scrape of /metrics, for the overlay
//! tests (overlay_peers.rs, overlay_relays.rs).

use std::time::Duration;

use kuport_proto::v1::node_sync_client::NodeSyncClient;
use kuport_proto::v1::{
    ControllerMessage, DesiredState, ExecutorMessage, Hello, NodeFacts, WireguardPeer, executor_message,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Connects to NodeSync at `address` (retrying until it listens) and opens the stream with
/// `hello`, the facts naming `key`, and `first` when given: the sender for more messages and
/// the controller's messages.
pub async fn connect(
    address: &str,
    hello: Hello,
    key: &str,
    first: Option<ExecutorMessage>,
) -> (mpsc::Sender<ExecutorMessage>, tonic::Streaming<ControllerMessage>) {
    let mut client = loop {
        if let Ok(c) = NodeSyncClient::connect(format!("http://{address}")).await {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (tx, rx) = mpsc::channel(8);
    tx.send(ExecutorMessage { message: Some(executor_message::Message::Hello(hello)) }).await.expect("send");
    let facts = NodeFacts { wireguard_public_key: key.into(), kernel: "test".into(), ..Default::default() };
    tx.send(ExecutorMessage { message: Some(executor_message::Message::Facts(facts)) }).await.expect("send");
    if let Some(m) = first {
        tx.send(m).await.expect("send");
    }
    let inbound = client.sync(ReceiverStream::new(rx)).await.expect("sync").into_inner();
    (tx, inbound)
}

/// The WireGuard peers of every device in a streamed state.
pub fn wireguard_peers(ds: &DesiredState) -> impl Iterator<Item = &WireguardPeer> {
    ds.state.iter().flat_map(|s| &s.netns).flat_map(|ns| &ns.wireguard_devices).flat_map(|d| &d.peers)
}

/// GET /metrics at `address`: the whole HTTP answer, or nothing while it does not listen.
pub fn metrics(address: &str) -> String {
    use std::io::{Read as _, Write as _};
    let Ok(mut c) = std::net::TcpStream::connect(address) else { return String::new() };
    let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n");
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out
}
