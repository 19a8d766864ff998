//! Both SglangService implementations (hand-framed and tonic-generated) answer alike:
//! the snapshot byte for byte, UNIMPLEMENTED elsewhere, and oversized requests refused early.

use std::net::SocketAddr;

use bytes::Bytes;
use tonic::Code;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

use _native::server::{MetadataServer, ServerOptions};
use _native::service::Implementation;
use _native::{GET_SERVER_INFO_PATH, SGLANG_SERVICE};

mod common;
use common::client::GetServerInfoRequest;
use common::client::sglang_service_client::SglangServiceClient;
use common::*;

const IMPLEMENTATIONS: [Implementation; 2] = [Implementation::Framed, Implementation::Generated];

fn start(implementation: Implementation, snapshot: &str) -> MetadataServer {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let options = ServerOptions {
        implementation,
        ..ServerOptions::default()
    };
    MetadataServer::start(addr, snapshot.to_owned(), &options).unwrap()
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

#[tokio::test]
async fn both_refuse_large_and_long_request_bodies_early() {
    for implementation in IMPLEMENTATIONS {
        let server = start(implementation, "{}");
        let (code, produced) = stream_body(&server, 1 << 20, 256).await;
        assert!(
            matches!(code, Code::ResourceExhausted | Code::OutOfRange),
            "{implementation:?}: {code:?}"
        );
        assert!(produced < 64, "{implementation:?}: {produced} MiB produced");
        let (code, produced) = stream_body(&server, 0, 100_000).await;
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
