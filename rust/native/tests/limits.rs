//! Each limit of the metadata server, hit on purpose over loopback: the offending client is
//! refused or dropped, and a well-behaved client is answered afterwards.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
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
use common::h2::*;
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

/// `count` calls opened and at once reset by the client (CANCEL), in one write: the server
/// decodes the whole burst before it accepts any of them, so all are reset while pending.
async fn open_and_reset(server: &MetadataServer, count: u32) -> Vec<Frame> {
    let mut stream = raw_connect(server).await;
    raw_handshake(&mut stream).await;
    let mut burst = Vec::new();
    for n in 0..count {
        let id = 1 + 2 * n;
        burst.extend(open_call(id));
        burst.extend(frame(FRAME_RST_STREAM, 0, id, &CANCEL.to_be_bytes()));
    }
    burst.extend(ping());
    send_and_read(&mut stream, &burst).await
}

#[tokio::test]
async fn more_than_20_streams_reset_before_the_server_reads_them_get_a_goaway() {
    let server = start_with(Limits::default());
    let within = open_and_reset(&server, 20).await;
    assert!(
        goaway(&within).is_none() && within.last().is_some_and(|f| f.kind == FRAME_PING),
        "20 rapid resets are within the bound: {within:?}"
    );
    let beyond = open_and_reset(&server, 21).await;
    let goaway =
        goaway(&beyond).unwrap_or_else(|| panic!("21 rapid resets and no GOAWAY: {beyond:?}"));
    assert_eq!(goaway.error_code(), ENHANCE_YOUR_CALM);
    assert_answers(&server).await;
    shutdown(server).await;
}

#[tokio::test]
async fn more_than_1024_error_resets_on_one_connection_get_a_goaway() {
    // A stream counts as open until its reset is written, which h2 does only once it has read
    // the whole burst: room for all of them, or refusals (error resets too) would blur the count.
    let server = start_with(Limits {
        max_concurrent_streams: 2048,
        ..Limits::default()
    });
    let mut stream = raw_connect(&server).await;
    raw_handshake(&mut stream).await;
    // A content-length that is not a number makes a request malformed (RFC 9113 §8.1.1): the
    // server resets that stream itself (PROTOCOL_ERROR), an error reset.
    let malformed = request_headers(GET_SERVER_INFO_PATH, Some("x"));
    let flags = FLAG_END_HEADERS | FLAG_END_STREAM;
    let burst = |streams: std::ops::Range<u32>| -> Vec<u8> {
        let mut bytes: Vec<u8> = streams
            .flat_map(|n| frame(FRAME_HEADERS, flags, 1 + 2 * n, &malformed))
            .collect();
        bytes.extend(ping());
        bytes
    };
    let within = send_and_read(&mut stream, &burst(0..1024)).await;
    assert!(
        goaway(&within).is_none() && within.last().is_some_and(|f| f.kind == FRAME_PING),
        "1024 error resets are within the bound"
    );
    let beyond = send_and_read(&mut stream, &burst(1024..1025)).await;
    let Some(goaway) = goaway(&beyond) else {
        panic!("a 1025th error reset and no GOAWAY");
    };
    assert_eq!(goaway.error_code(), ENHANCE_YOUR_CALM);
    // The first 1024 were reset for the malformed requests, before the GOAWAY.
    let sent = [resets(&within), resets(&beyond)].concat();
    let errors = sent.iter().filter(|(_, code)| *code == PROTOCOL_ERROR);
    assert_eq!((errors.count(), sent.len()), (1024, 1024));
    assert_answers(&server).await;
    shutdown(server).await;
}

#[tokio::test]
async fn a_stream_beyond_max_concurrent_streams_is_refused_while_the_others_stay_open() {
    let server = start_with(Limits {
        max_concurrent_streams: 4,
        ..Limits::default()
    });
    let mut stream = raw_connect(&server).await;
    raw_handshake(&mut stream).await;
    let mut burst: Vec<u8> = (0..5).flat_map(|n| open_call(1 + 2 * n)).collect();
    burst.extend(ping());
    let frames = send_and_read(&mut stream, &burst).await;
    assert!(goaway(&frames).is_none(), "{frames:?}");
    // By the PING's ACK the server has handled all five: only the fifth is refused.
    assert_eq!(resets(&frames), [(9, REFUSED_STREAM)]);

    // The first was still open, not dropped: ending its request (one empty message) gets it
    // answered.
    let end = frame(FRAME_DATA, FLAG_END_STREAM, 1, &[0; 5]);
    stream.write_all(&end).await.unwrap();
    let answer = tokio::time::timeout(DEADLINE, async {
        while let Some(frame) = read_frame_on(&mut stream).await {
            if frame.stream_id == 1 && frame.kind != FRAME_WINDOW_UPDATE {
                return Some(frame);
            }
        }
        None
    })
    .await
    .expect("an answer within the deadline")
    .expect("the connection stayed open");
    assert_eq!(answer.kind, FRAME_HEADERS, "{answer:?}");
    drop(stream);
    shutdown(server).await;
}

/// The server's end of the connection `client` made: the server runs in this process, so it
/// is the socket among this process's descriptors bound to `server` with `client` as its peer.
#[cfg(target_os = "linux")]
fn accepted_socket(server: SocketAddr, client: SocketAddr) -> Option<socket2::Socket> {
    use std::os::fd::{BorrowedFd, RawFd};
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<RawFd>() else {
            continue;
        };
        if !is_socket {
            continue;
        }
        // SAFETY: the descriptor is only duplicated, at once. If another test closed it since
        // the listing, the duplicate fails or is of another file, which the check below skips.
        let Ok(owned) = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned() else {
            continue;
        };
        let socket = socket2::Socket::from(owned);
        let own = socket.local_addr().ok().and_then(|addr| addr.as_socket());
        let peer = socket.peer_addr().ok().and_then(|addr| addr.as_socket());
        if own == Some(server) && peer == Some(client) {
            return Some(socket);
        }
    }
    None
}

/// SO_KEEPALIVE, TCP_KEEPIDLE and TCP_KEEPINTVL (seconds) and TCP_KEEPCNT on the server's end
/// of a new connection.
#[cfg(target_os = "linux")]
async fn server_keepalive(limits: Limits) -> (bool, u64, u64, u32) {
    let server = start_with(limits);
    let mut client = raw_connect(&server).await;
    raw_handshake(&mut client).await;
    // The server's SETTINGS: the connection reached hyper, so its options were set.
    let (kind, _, _) = tokio::time::timeout(DEADLINE, read_frame(&mut client))
        .await
        .unwrap()
        .expect("SETTINGS");
    assert_eq!(kind, FRAME_SETTINGS);
    let socket = accepted_socket(server.local_addr(), client.local_addr().unwrap())
        .expect("the server's end of the connection");
    let options = (
        socket.keepalive().unwrap(),
        socket.tcp_keepalive_time().unwrap().as_secs(),
        socket.tcp_keepalive_interval().unwrap().as_secs(),
        socket.tcp_keepalive_retries().unwrap(),
    );
    drop(client);
    shutdown(server).await;
    options
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn tcp_keepalive_s_is_set_on_accepted_connections() {
    // Not a system default: idle 8 s, then 4 probes 2 s apart.
    let options = server_keepalive(Limits {
        tcp_keepalive: Duration::from_secs(8),
        ..Limits::default()
    })
    .await;
    assert_eq!(options, (true, 8, 2, 4));
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_tcp_keepalive_s_linux_cannot_take_is_clamped_not_dropped() {
    // Linux refuses an idle time below 1 s or above 32767 s; passed as is, the connection
    // would keep the system's two hours.
    let short = server_keepalive(Limits {
        tcp_keepalive: Duration::from_millis(500),
        ..Limits::default()
    })
    .await;
    assert_eq!(short, (true, 1, 1, 4));
    let long = server_keepalive(Limits {
        tcp_keepalive: Duration::from_secs(86_400),
        ..Limits::default()
    })
    .await;
    assert_eq!(long, (true, 32767, 8191, 4));
}
