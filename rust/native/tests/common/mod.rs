//! Client-side helpers shared by the integration tests: a channel, a bounded shutdown, a raw
//! codec, and a lazily streamed GetServerInfo request body.

// Each test crate uses a different subset.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use tokio_stream::StreamExt as _;
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

use _native::GET_SERVER_INFO_PATH;
use _native::server::MetadataServer;

pub mod h2;

/// The generated SglangService client and its messages: built for these tests only (the
/// module itself never calls the service).
pub mod client {
    include!(concat!(env!("OUT_DIR"), "/client/sglang.runtime.v1.rs"));
}

/// Every wait in these tests ends by this deadline; the machine may be busy.
pub const DEADLINE: Duration = Duration::from_secs(20);

pub async fn channel(server: &MetadataServer) -> Channel {
    Endpoint::from_shared(format!("http://{}", server.local_addr()))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap()
}

/// Shuts the server down off the async runtime (shutdown blocks until the server thread ends).
pub async fn shutdown(server: MetadataServer) {
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap();
}

/// Sends raw, already-framed gRPC messages and hands back the reply body as it came.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Self;
    type Decoder = Self;

    fn encoder(&mut self) -> Self {
        *self
    }

    fn decoder(&mut self) -> Self {
        *self
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Streams `count` messages of `size` bytes lazily on the GetServerInfo path; returns the
/// status and how many messages the client got to produce.
pub async fn stream_body(server: &MetadataServer, size: usize, count: usize) -> (Code, usize) {
    let produced = Arc::new(AtomicUsize::new(0));
    let counter = produced.clone();
    let message = Bytes::from(vec![0u8; size]);
    let body = tokio_stream::iter(0..count).map(move |_| {
        counter.fetch_add(1, Ordering::Relaxed);
        message.clone()
    });
    let mut grpc = tonic::client::Grpc::new(channel(server).await)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    grpc.ready().await.unwrap();
    let call = grpc.client_streaming(
        tonic::Request::new(body),
        PathAndQuery::from_static(GET_SERVER_INFO_PATH),
        RawCodec,
    );
    let code = match tokio::time::timeout(DEADLINE, call)
        .await
        .expect("a verdict")
    {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    };
    (code, produced.load(Ordering::Relaxed))
}
