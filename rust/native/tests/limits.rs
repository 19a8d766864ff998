//! Each limit of the metadata server, hit on purpose over loopback: the offending client is
//! refused or dropped, and a well-behaved client is answered afterwards.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_stream::StreamExt as _;
use tonic::Code;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use _native::GET_SERVER_INFO_PATH;
use _native::incoming::HTTP2_PREFACE;
use _native::limits::Limits;
use _native::server::{MetadataServer, ServerOptions};

mod common;
use common::client::GetServerInfoRequest;
use common::client::sglang_service_client::SglangServiceClient;
use common::*;

const SNAPSHOT: &str = r#"{"node_rank": 1}"#;

fn start_with(limits: Limits) -> MetadataServer {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let options = ServerOptions {
        limits,
        ..ServerOptions::default()
    };
    MetadataServer::start(addr, SNAPSHOT.to_owned(), &options).unwrap()
}

async fn assert_answers(server: &MetadataServer) {
    let mut client = SglangServiceClient::new(channel(server).await);
    let reply = tokio::time::timeout(DEADLINE, client.get_server_info(GetServerInfoRequest {}))
        .await
        .expect("answer within the deadline")
        .expect("a well-behaved call succeeds");
    assert_eq!(reply.into_inner().json_info, SNAPSHOT);
}

/// The server answers RESOURCE_EXHAUSTED and resets the rest of the request (RST_STREAM
/// NO_ERROR). A tonic client still writing when the reset lands sometimes reports its own
/// broken pipe (UNKNOWN, "transport error") instead of the status it was sent; grpcio reports
/// the status (tests/test_hostile_input.py).
fn refused(code: Code) -> bool {
    matches!(code, Code::ResourceExhausted | Code::Unknown)
}

#[tokio::test]
async fn a_large_request_message_is_refused_before_the_body_is_read() {
    let server = start_with(Limits::default());
    // 512 messages of 1 MiB: 512 MiB the server must not read.
    let (code, produced) = stream_body(&server, 1 << 20, 512).await;
    assert_eq!(code, Code::ResourceExhausted);
    assert!(produced < 64, "the client got to produce {produced} MiB");
    assert_answers(&server).await;
    shutdown(server).await;
}

#[tokio::test]
async fn many_small_request_messages_are_refused_past_max_request_bytes() {
    let server = start_with(Limits {
        max_request_bytes: 1024,
        ..Limits::default()
    });
    // 100,000 empty messages (5 bytes of framing each), far past 1 KiB in total.
    let (code, produced) = stream_body(&server, 0, 100_000).await;
    assert!(refused(code), "{code:?}");
    assert!(produced < 100_000, "the whole body was read");
    assert_answers(&server).await;
    shutdown(server).await;
}

#[tokio::test]
async fn a_request_within_the_limits_is_answered() {
    let server = start_with(Limits::default());
    let (code, _) = stream_body(&server, 16, 4).await;
    assert_eq!(code, Code::Ok);
    shutdown(server).await;
}

#[tokio::test]
async fn health_refuses_a_message_larger_than_max_message_bytes() {
    let server = start_with(Limits {
        max_message_bytes: 256,
        ..Limits::default()
    });
    let mut health = HealthClient::new(channel(&server).await);
    let status = health
        .check(HealthCheckRequest {
            service: "x".repeat(1024),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{status:?}"
    );
    let ok = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    shutdown(server).await;
}

#[tokio::test]
async fn oversized_headers_are_refused() {
    let server = start_with(Limits {
        max_header_list_bytes: 4096,
        ..Limits::default()
    });
    let mut client = SglangServiceClient::new(channel(&server).await);
    let mut request = tonic::Request::new(GetServerInfoRequest {});
    request
        .metadata_mut()
        .insert("x-padding", "p".repeat(16 * 1024).parse().unwrap());
    let result = tokio::time::timeout(DEADLINE, client.get_server_info(request))
        .await
        .expect("a verdict");
    assert!(result.is_err(), "16 KiB of headers accepted");
    assert_answers(&server).await;
    shutdown(server).await;
}

// --- raw HTTP/2 ------------------------------------------------------------------------------

const FRAME_SETTINGS: u8 = 0x4;
const FRAME_PING: u8 = 0x6;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

async fn raw_connect(server: &MetadataServer) -> TcpStream {
    TcpStream::connect(server.local_addr()).await.unwrap()
}

/// The preface and an empty SETTINGS frame: what a client sends before anything else.
async fn raw_handshake(stream: &mut TcpStream) {
    try_raw_handshake(stream).await.unwrap();
}

/// The handshake on a connection the server may already have closed (EPIPE/ECONNRESET).
async fn try_raw_handshake(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(HTTP2_PREFACE).await?;
    stream
        .write_all(&[0, 0, 0, FRAME_SETTINGS, 0, 0, 0, 0, 0])
        .await
}

/// Next frame as (type, flags, payload); None once the server closed the connection.
async fn read_frame(stream: &mut TcpStream) -> Option<(u8, u8, Vec<u8>)> {
    let mut header = [0u8; 9];
    stream.read_exact(&mut header).await.ok()?;
    let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let mut payload = vec![0u8; length];
    stream.read_exact(&mut payload).await.ok()?;
    Some((header[3], header[4], payload))
}

/// True once the peer closed (EOF or reset), reading and discarding whatever comes first.
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn the_server_advertises_its_stream_and_header_limits() {
    let server = start_with(Limits {
        max_concurrent_streams: 7,
        max_header_list_bytes: 5000,
        ..Limits::default()
    });
    let mut stream = raw_connect(&server).await;
    raw_handshake(&mut stream).await;
    let (kind, _, payload) = tokio::time::timeout(DEADLINE, read_frame(&mut stream))
        .await
        .unwrap()
        .expect("the server's SETTINGS");
    assert_eq!(kind, FRAME_SETTINGS);
    let settings: Vec<(u16, u32)> = payload
        .chunks_exact(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect();
    assert!(
        settings.contains(&(SETTINGS_MAX_CONCURRENT_STREAMS, 7)),
        "{settings:?}"
    );
    assert!(
        settings.contains(&(SETTINGS_MAX_HEADER_LIST_SIZE, 5000)),
        "{settings:?}"
    );
    shutdown(server).await;
}

#[tokio::test]
async fn garbage_and_http1_are_dropped_without_reaching_hyper() {
    let server = start_with(Limits::default());
    for bytes in [&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..], &[0xffu8; 64][..]] {
        let mut stream = raw_connect(&server).await;
        stream.write_all(bytes).await.unwrap();
        assert!(closed_by_server(&mut stream).await);
    }
    assert_answers(&server).await;
    shutdown(server).await;
}

#[tokio::test]
async fn a_client_that_never_finishes_the_preface_is_dropped_after_the_handshake_timeout() {
    let server = start_with(Limits {
        handshake_timeout: Duration::from_millis(300),
        ..Limits::default()
    });
    let mut silent = raw_connect(&server).await;
    let mut partial = raw_connect(&server).await;
    // On a loaded machine the timeout may already have closed it: a failed write is fine too.
    let _ = partial.write_all(&HTTP2_PREFACE[..10]).await;
    assert!(closed_by_server(&mut silent).await);
    assert!(closed_by_server(&mut partial).await);
    assert_answers(&server).await;
    shutdown(server).await;
}

#[tokio::test]
async fn connections_beyond_max_connections_are_closed_and_slots_come_back() {
    let server = start_with(Limits {
        max_connections: 3,
        ..Limits::default()
    });
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = raw_connect(&server).await;
        raw_handshake(&mut stream).await;
        // The server's SETTINGS prove the connection reached hyper and holds its permit.
        let (kind, _, _) = tokio::time::timeout(DEADLINE, read_frame(&mut stream))
            .await
            .unwrap()
            .expect("SETTINGS");
        assert_eq!(kind, FRAME_SETTINGS);
        held.push(stream);
    }
    let mut extra = raw_connect(&server).await;
    // The refusal may close the socket before the handshake is written: a broken pipe is a pass.
    let written = try_raw_handshake(&mut extra).await;
    assert!(
        written.is_err() || closed_by_server(&mut extra).await,
        "a 4th connection stayed open"
    );

    held.clear();
    // Permits return when hyper notices the closed sockets; retry until one is free.
    let answered = tokio::time::timeout(DEADLINE, async {
        loop {
            let channel = Endpoint::from_shared(format!("http://{}", server.local_addr()))
                .unwrap()
                .connect()
                .await;
            if let Ok(channel) = channel {
                let mut client = SglangServiceClient::new(channel);
                if client
                    .get_server_info(GetServerInfoRequest {})
                    .await
                    .is_ok()
                {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        answered.is_ok(),
        "no slot came back after closing the held connections"
    );
    shutdown(server).await;
}

#[tokio::test]
async fn a_peer_that_ignores_keepalive_pings_is_disconnected() {
    let server = start_with(Limits {
        keepalive_interval: Duration::from_millis(200),
        keepalive_timeout: Duration::from_millis(200),
        ..Limits::default()
    });
    let mut stream = raw_connect(&server).await;
    raw_handshake(&mut stream).await;
    let mut saw_ping = false;
    let outcome = tokio::time::timeout(DEADLINE, async {
        while let Some((kind, flags, _)) = read_frame(&mut stream).await {
            // A PING without the ACK flag is the server's keepalive; never answer it.
            if kind == FRAME_PING && flags & 0x1 == 0 {
                saw_ping = true;
            }
        }
    })
    .await;
    assert!(outcome.is_ok(), "the connection was not closed");
    assert!(saw_ping, "the server closed without pinging");
    shutdown(server).await;
}

#[tokio::test]
async fn a_request_body_that_never_ends_is_cut_at_the_request_timeout() {
    let server = start_with(Limits {
        request_timeout: Duration::from_millis(300),
        ..Limits::default()
    });
    let body = tokio_stream::iter([Bytes::new()]).chain(tokio_stream::pending());
    let mut grpc = tonic::client::Grpc::new(channel(&server).await);
    grpc.ready().await.unwrap();
    let call = grpc.client_streaming(
        tonic::Request::new(body),
        PathAndQuery::from_static(GET_SERVER_INFO_PATH),
        RawCodec,
    );
    let status = tokio::time::timeout(DEADLINE, call)
        .await
        .expect("a verdict")
        .unwrap_err();
    assert!(
        matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{status:?}"
    );
    assert_answers(&server).await;
    shutdown(server).await;
}
