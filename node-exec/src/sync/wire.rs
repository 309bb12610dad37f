//! The Sync call with the controller's messages taken as bytes and decoded here: a message that
//! does not decode is then refused with a NACK naming its state (the stream goes on), where
//! tonic's own decoder would end the stream without one. Messages larger than
//! [`MAX_STATE_MESSAGE`] are refused by tonic from their length alone, never buffered.

use kuport_proto::channel::MAX_STATE_MESSAGE;
use kuport_proto::v1::{ControllerMessage, DesiredState, ExecutorMessage};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::codegen::Bytes;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic_prost::ProstEncoder;

/// Executor messages encoded by prost; controller messages handed up as their bytes.
#[derive(Debug, Default, Clone, Copy)]
pub struct RawInbound;

impl Codec for RawInbound {
    type Encode = ExecutorMessage;
    type Decode = Bytes;
    type Encoder = ProstEncoder<ExecutorMessage>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(Default::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        use prost::bytes::Buf;
        Ok(Some(buf.copy_to_bytes(buf.remaining())))
    }
}

/// Opens the Sync stream on `conn`: states up to [`MAX_STATE_MESSAGE`] come down as bytes.
pub async fn sync(
    conn: Channel,
    request: tonic::Request<impl tonic::codegen::tokio_stream::Stream<Item = ExecutorMessage> + Send + 'static>,
    max_encoding: usize,
) -> Result<tonic::Streaming<Bytes>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(conn)
        .max_decoding_message_size(MAX_STATE_MESSAGE)
        .max_encoding_message_size(max_encoding);
    grpc.ready().await.map_err(|e| tonic::Status::unknown(format!("service was not ready: {e}")))?;
    let path = PathAndQuery::from_static("/kuport.v1.NodeSync/Sync");
    Ok(grpc.streaming(request, path, RawInbound).await?.into_inner())
}

/// The fields of a DesiredState that say which state it is, read without its content.
#[derive(Clone, PartialEq, Message)]
struct Header {
    #[prost(uint64, tag = "1")]
    term: u64,
    #[prost(uint64, tag = "2")]
    sequence: u64,
    #[prost(string, tag = "3")]
    version: String,
}

/// A ControllerMessage whose state is read as a [`Header`] only.
#[derive(Clone, PartialEq, Message)]
struct HeaderMessage {
    #[prost(message, optional, tag = "1")]
    state: Option<Header>,
}

/// A message that did not decode: which state it was, as far as that can be read, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Undecodable {
    /// term, sequence and version; empty when even they do not decode (or it was no state).
    pub state: DesiredState,
    pub reason: String,
}

/// Decodes one controller message.
pub fn decode(bytes: Bytes) -> Result<ControllerMessage, Undecodable> {
    ControllerMessage::decode(bytes.clone()).map_err(|e| {
        let header = HeaderMessage::decode(bytes).ok().and_then(|m| m.state).unwrap_or_default();
        Undecodable {
            state: DesiredState { term: header.term, sequence: header.sequence, version: header.version, state: None },
            reason: format!("the state does not decode: {e}"),
        }
    })
}

/// Whether a stream error is tonic's refusal of a message over the decode limit.
pub fn is_oversize(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::OutOfRange && status.message().contains("too large")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kuport_proto::v1::controller_message;

    #[test]
    fn a_state_that_does_not_decode_still_names_itself() {
        let ds = DesiredState { term: 3, sequence: 9, version: "abc".into(), state: None };
        let mut good = ControllerMessage { message: Some(controller_message::Message::State(ds)) }.encode_to_vec();
        assert!(decode(Bytes::from(good.clone())).is_ok());
        // Field 4 (the NodeState) holding a string field with bytes that are no UTF-8.
        let node = [0x0a, 0x02, 0xff, 0xfe];
        let mut state = vec![0x22, node.len() as u8];
        state.extend(node);
        // The outer length grows by the added bytes.
        good[1] += state.len() as u8;
        good.extend(state);
        let e = decode(Bytes::from(good)).unwrap_err();
        assert_eq!((e.state.term, e.state.sequence, e.state.version.as_str()), (3, 9, "abc"));
        assert!(e.reason.contains("does not decode"), "{}", e.reason);
        let e = decode(Bytes::from_static(&[0xff, 0xff])).unwrap_err();
        assert_eq!(e.state, DesiredState::default());
    }
}
