//! Round trips against a real server over loopback with real tonic clients.

use std::net::SocketAddr;
use std::time::Duration;

use _native::server::{MetadataServer, ServerOptions, StartError};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

mod common;
use common::client::GetServerInfoRequest;
use common::client::sglang_service_client::SglangServiceClient;
use common::*;

const UPSTREAM_RPCS: &str = include_str!("../../../tests/data/upstream_sglang_rpcs.txt");
const SGLANG_SERVICE: &str = "sglang.runtime.v1.SglangService";

fn start(snapshot: &str) -> MetadataServer {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    MetadataServer::start(addr, snapshot.to_owned(), &ServerOptions::default()).unwrap()
}

#[tokio::test]
async fn get_server_info_returns_the_snapshot_byte_for_byte() {
    let snapshot = r#"{"node_rank": 1, "name": "nœud-ü", "kv_event_sources": []}"#;
    let server = start(snapshot);
    let mut client = SglangServiceClient::new(channel(&server).await);
    let reply = client
        .get_server_info(GetServerInfoRequest {})
        .await
        .unwrap();
    assert_eq!(reply.into_inner().json_info, snapshot);
    shutdown(server).await;
}

#[tokio::test]
async fn every_other_upstream_method_and_unknown_services_are_unimplemented() {
    let server = start("{}");
    let mut grpc = tonic::client::Grpc::new(channel(&server).await);
    let methods: Vec<&str> = UPSTREAM_RPCS
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect();
    assert_eq!(methods.len(), 26);
    let mut paths: Vec<String> = methods
        .iter()
        .filter(|method| **method != "GetServerInfo")
        .map(|method| format!("/{SGLANG_SERVICE}/{method}"))
        .collect();
    paths.push("/some.other.Service/Method".into());
    for path in paths {
        grpc.ready().await.unwrap();
        let codec =
            tonic_prost::ProstCodec::<GetServerInfoRequest, GetServerInfoRequest>::default();
        let status = grpc
            .unary(
                tonic::Request::new(GetServerInfoRequest {}),
                path.parse().unwrap(),
                codec,
            )
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unimplemented, "{path}");
    }
    shutdown(server).await;
}

async fn next_status(stream: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>) -> i32 {
    tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("health watch update within 5 s")
        .unwrap()
        .expect("stream still open")
        .status
}

#[tokio::test]
async fn health_watch_sees_not_serving_serving_not_serving() {
    let server = std::sync::Arc::new(start("{}"));
    let mut health = HealthClient::new(channel(&server).await);
    for service in ["", SGLANG_SERVICE] {
        let reply = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap();
        assert_eq!(reply.into_inner().status, ServingStatus::NotServing as i32);
    }
    let mut watch = health
        .watch(HealthCheckRequest {
            service: SGLANG_SERVICE.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        next_status(&mut watch).await,
        ServingStatus::NotServing as i32
    );

    let handle = server.clone();
    tokio::task::spawn_blocking(move || handle.set_serving(true))
        .await
        .unwrap();
    assert_eq!(next_status(&mut watch).await, ServingStatus::Serving as i32);

    let handle = server.clone();
    tokio::task::spawn_blocking(move || handle.set_serving(false))
        .await
        .unwrap();
    assert_eq!(
        next_status(&mut watch).await,
        ServingStatus::NotServing as i32
    );

    // An unknown service name is reported as such, not as healthy.
    let status = health
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap();
}

#[tokio::test]
async fn shutdown_is_bounded_while_a_watch_stream_is_open_and_closes_the_port() {
    let server = start("{}");
    let addr = server.local_addr();
    let mut health = HealthClient::new(channel(&server).await);
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    next_status(&mut watch).await;

    let started = std::time::Instant::now();
    let server = tokio::task::spawn_blocking(move || {
        server.shutdown();
        server
    })
    .await
    .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert!(!server.is_alive());
    server.shutdown(); // idempotent

    // The stream ends (or errors) instead of hanging, and nothing listens any more.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = watch.message().await {}
    })
    .await;
    assert!(ended.is_ok(), "watch stream still open after shutdown");
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[test]
fn a_second_server_on_the_same_port_fails_cleanly() {
    let first = start("{}");
    let err = MetadataServer::start(first.local_addr(), "{}".into(), &ServerOptions::default())
        .err()
        .expect("second bind must fail");
    match &err {
        StartError::Bind { addr, source } => {
            assert_eq!(*addr, first.local_addr());
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains(&first.local_addr().to_string()));
    assert!(first.is_alive());
}

#[test]
fn snapshots_that_are_not_json_objects_are_refused() {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    for bad in ["not json", "[1, 2]", "{\"a\": ", ""] {
        let err = MetadataServer::start(addr, bad.into(), &ServerOptions::default())
            .err()
            .unwrap_or_else(|| panic!("{bad:?} accepted"));
        assert!(matches!(err, StartError::InvalidJson(_)), "{bad:?}: {err}");
    }
}

#[tokio::test]
async fn serving_set_right_after_start_is_not_lost() {
    let server = std::sync::Arc::new(start("{}"));
    let handle = server.clone();
    tokio::task::spawn_blocking(move || handle.set_serving(true))
        .await
        .unwrap();
    let mut health = HealthClient::new(channel(&server).await);
    let reply = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(reply.into_inner().status, ServingStatus::Serving as i32);
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap();
}
