//! Both SglangService implementations (hand-framed and tonic-generated) answer alike:
//! the snapshot byte for byte, UNIMPLEMENTED elsewhere, and oversized requests refused early.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use tokio_stream::StreamExt as _;
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

use _native::proto::GetServerInfoRequest;
use _native::proto::sglang_service_client::SglangServiceClient;
use _native::server::{MetadataServer, ServerOptions};
use _native::service::Implementation;
use _native::{GET_SERVER_INFO_PATH, SGLANG_SERVICE};

const IMPLEMENTATIONS: [Implementation; 2] = [Implementation::Framed, Implementation::Generated];
const DEADLINE: Duration = Duration::from_secs(20);

fn start(implementation: Implementation, snapshot: &str) -> MetadataServer {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let options = ServerOptions {
        implementation,
        ..ServerOptions::default()
    };
    MetadataServer::start(addr, snapshot.to_owned(), &options).unwrap()
}

async fn channel(server: &MetadataServer) -> Channel {
    Endpoint::from_shared(format!("http://{}", server.local_addr()))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn shutdown(server: MetadataServer) {
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap();
}

#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

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

async fn unary(grpc: &mut tonic::client::Grpc<Channel>, path: &str) -> Result<Bytes, Code> {
    grpc.ready().await.unwrap();
    grpc.unary(
        tonic::Request::new(Bytes::new()),
        PathAndQuery::try_from(path).unwrap(),
        RawCodec,
    )
    .await
    .map(tonic::Response::into_inner)
    .map_err(|status| status.code())
}

#[test]
fn the_method_path_is_derived_from_the_service_name() {
    assert_eq!(
        GET_SERVER_INFO_PATH,
        format!("/{SGLANG_SERVICE}/GetServerInfo")
    );
}

#[tokio::test]
async fn both_return_the_snapshot_and_unimplemented_elsewhere() {
    let snapshot = format!(r#"{{"pad": "{}", "name": "nœud"}}"#, "x".repeat(300_000));
    for implementation in IMPLEMENTATIONS {
        let server = start(implementation, &snapshot);
        let mut client =
            SglangServiceClient::new(channel(&server).await).max_decoding_message_size(4 << 20);
        let reply = client
            .get_server_info(GetServerInfoRequest {})
            .await
            .unwrap();
        assert_eq!(reply.into_inner().json_info, snapshot, "{implementation:?}");
        let mut grpc = tonic::client::Grpc::new(channel(&server).await);
        for path in [
            format!("/{SGLANG_SERVICE}/Generate"),
            "/some.other.Service/Method".into(),
        ] {
            assert_eq!(
                unary(&mut grpc, &path).await.unwrap_err(),
                Code::Unimplemented,
                "{implementation:?} {path}"
            );
        }
        shutdown(server).await;
    }
}

async fn streamed(server: &MetadataServer, size: usize, count: usize) -> (Code, usize) {
    let produced = Arc::new(AtomicUsize::new(0));
    let counter = produced.clone();
    let message = Bytes::from(vec![0u8; size]);
    let body = tokio_stream::iter(0..count).map(move |_| {
        counter.fetch_add(1, Ordering::Relaxed);
        message.clone()
    });
    let mut grpc =
        tonic::client::Grpc::new(channel(server).await).max_encoding_message_size(usize::MAX);
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

#[tokio::test]
async fn both_refuse_large_and_long_request_bodies_early() {
    for implementation in IMPLEMENTATIONS {
        let server = start(implementation, "{}");
        let (code, produced) = streamed(&server, 1 << 20, 256).await;
        assert!(
            matches!(code, Code::ResourceExhausted | Code::OutOfRange),
            "{implementation:?}: {code:?}"
        );
        assert!(produced < 64, "{implementation:?}: {produced} MiB produced");
        let (code, produced) = streamed(&server, 0, 100_000).await;
        // RESOURCE_EXHAUSTED, or the tonic client's own broken pipe when the server's reset
        // of the rest lands while it is still writing (see tests/limits.rs, `refused`).
        assert!(
            matches!(code, Code::ResourceExhausted | Code::Unknown),
            "{implementation:?}: {code:?}"
        );
        assert!(
            produced < 100_000,
            "{implementation:?}: the whole body was read"
        );
        shutdown(server).await;
    }
}
