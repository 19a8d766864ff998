//! Closed-loop load generator for `sglang.runtime.v1.SglangService/GetServerInfo`.
//!
//! N clients, each on its own HTTP/2 connection, call GetServerInfo back to back for a warm-up
//! period and then for a measured period; only calls that start and end inside the measured
//! period count.
//!
//! On a small machine the client shares cores with the server under test, so a cheaper client
//! keeps the comparison about the servers. The default client (`--client h2`) speaks gRPC on
//! `h2` directly: it counts each DATA frame's bytes as it arrives and releases the frame, then
//! checks the gRPC prefix's length and `grpc-status`. `--client tonic` is tonic's unary call with
//! a counting codec: tonic gathers the whole message into one growing buffer before the codec
//! sees it, a copy per reply that costs more the more replies are in flight at once.
//!
//! The client keeps its heap (`keep_heap`): with glibc's defaults, a client holding many large
//! replies at once gave pages back to the system as they were freed and faulted them in again
//! for the next replies: about 55 page faults per 1 MiB call at 16 clients, and only against
//! the servers fast enough to have many replies in flight.
//!
//! With `--calls N` each client instead makes exactly N calls, every one counted (a soak: the
//! duration and warm-up are ignored).
//!
//! Prints one JSON object: throughput, latency percentiles, bytes per response, errors.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use tokio::net::TcpStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

const GET_SERVER_INFO: &str = "/sglang.runtime.v1.SglangService/GetServerInfo";
const MAX_MESSAGE: usize = 64 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The empty `GetServerInfoRequest`: the gRPC prefix alone (not compressed, length 0).
const EMPTY_REQUEST: [u8; 5] = [0; 5];
// hyper's HTTP/2 client defaults, which tonic's channel uses: both clients get the same windows
// and frames from every server.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
const MAX_FRAME: u32 = 16 * 1024;
const MAX_HEADER_LIST: u32 = 16 * 1024;

const USAGE: &str = "usage: bench-client --target HOST:PORT [--concurrency N] [--duration SECS] \
[--warmup SECS] [--threads N] [--expect-bytes N] [--calls N] [--client h2|tonic]";

/// How a client makes its calls (see the module's text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientKind {
    H2,
    Tonic,
}

impl ClientKind {
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "h2" => Ok(Self::H2),
            "tonic" => Ok(Self::Tonic),
            _ => Err(format!("--client {text:?}: expected h2 or tonic")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::H2 => "h2",
            Self::Tonic => "tonic",
        }
    }
}

#[derive(Debug, Clone)]
struct Args {
    target: String,
    concurrency: usize,
    duration: Duration,
    warmup: Duration,
    threads: usize,
    expect_bytes: Option<usize>,
    /// Calls per client; replaces the timed warm-up and measurement when set.
    calls: Option<u64>,
    client: ClientKind,
}

fn parse_args(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        target: String::new(),
        concurrency: 1,
        duration: Duration::from_secs(3),
        warmup: Duration::from_secs(1),
        threads: 1,
        expect_bytes: None,
        calls: None,
        client: ClientKind::H2,
    };
    while let Some(flag) = argv.next() {
        let value = argv.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<f64>()
                .map_err(|e| format!("{flag} {value:?}: {e}"))
        };
        match flag.as_str() {
            "--target" => args.target = value.clone(),
            "--concurrency" => args.concurrency = number()? as usize,
            "--duration" => args.duration = Duration::from_secs_f64(number()?),
            "--warmup" => args.warmup = Duration::from_secs_f64(number()?),
            "--threads" => args.threads = number()? as usize,
            "--expect-bytes" => args.expect_bytes = Some(number()? as usize),
            "--calls" => args.calls = Some(number()? as u64),
            "--client" => args.client = ClientKind::parse(&value)?,
            _ => return Err(format!("unknown option {flag:?}")),
        }
    }
    if args.target.is_empty() {
        return Err("--target is required".into());
    }
    if args.concurrency == 0 || args.threads == 0 || args.calls == Some(0) {
        return Err("--concurrency, --threads and --calls must be at least 1".into());
    }
    Ok(args)
}

/// Sends the empty `GetServerInfoRequest` and yields the response message's length.
#[derive(Debug, Clone, Copy, Default)]
struct CountingCodec;

impl Codec for CountingCodec {
    type Encode = ();
    type Decode = usize;
    type Encoder = Self;
    type Decoder = Self;

    fn encoder(&mut self) -> Self::Encoder {
        *self
    }

    fn decoder(&mut self) -> Self::Decoder {
        *self
    }
}

impl Encoder for CountingCodec {
    type Item = ();
    type Error = Status;

    fn encode(&mut self, _item: (), _dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        Ok(())
    }
}

impl Decoder for CountingCodec {
    type Item = usize;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<usize>, Status> {
        let len = src.remaining();
        src.advance(len);
        Ok(Some(len))
    }
}

#[derive(Debug, Default)]
struct ClientResult {
    latencies_ns: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
    wrong_size: u64,
    response_bytes: usize,
}

/// The 5-byte gRPC message prefix, gathered from the first DATA frames whatever their sizes.
#[derive(Debug, Default)]
struct MessagePrefix {
    bytes: [u8; 5],
    filled: usize,
}

impl MessagePrefix {
    fn feed(&mut self, chunk: &[u8]) {
        let take = (self.bytes.len() - self.filled).min(chunk.len());
        self.bytes[self.filled..self.filled + take].copy_from_slice(&chunk[..take]);
        self.filled += take;
    }

    /// The declared message length, or why there is none.
    fn message_len(&self) -> Result<usize, String> {
        if self.filled < self.bytes.len() {
            return Err(format!(
                "reply shorter than the gRPC prefix ({} bytes)",
                self.filled
            ));
        }
        if self.bytes[0] != 0 {
            return Err(format!(
                "compressed flag {} (none was asked for)",
                self.bytes[0]
            ));
        }
        let len = u32::from_be_bytes([self.bytes[1], self.bytes[2], self.bytes[3], self.bytes[4]]);
        Ok(len as usize)
    }
}

/// `grpc-status` of a header block (the trailers, or the headers of a trailers-only reply):
/// `Ok(true)` when it is present and 0.
fn grpc_ok(headers: &http::HeaderMap) -> Result<bool, String> {
    match headers.get("grpc-status") {
        None => Ok(false),
        Some(status) if status == "0" => Ok(true),
        Some(status) => Err(format!(
            "grpc-status {status:?}: {:?}",
            headers.get("grpc-message")
        )),
    }
}

/// One connection's way of calling GetServerInfo; yields the reply message's length.
enum Caller {
    H2 {
        send: h2::client::SendRequest<Bytes>,
        uri: http::Uri,
    },
    Tonic(tonic::client::Grpc<Channel>),
}

impl Caller {
    async fn connect(kind: ClientKind, target: &str) -> Result<Self, String> {
        let uri: http::Uri = format!("http://{target}{GET_SERVER_INFO}")
            .parse()
            .map_err(|e| format!("bad target {target:?}: {e}"))?;
        match kind {
            ClientKind::H2 => Ok(Self::H2 {
                send: connect_h2(target).await?,
                uri,
            }),
            ClientKind::Tonic => connect_tonic(target).await.map(Self::Tonic),
        }
    }

    async fn call(&mut self) -> Result<usize, String> {
        match self {
            Self::H2 { send, uri } => call_h2(send, uri).await,
            Self::Tonic(grpc) => call_tonic(grpc).await.map_err(|status| status.to_string()),
        }
    }
}

async fn connect_h2(target: &str) -> Result<h2::client::SendRequest<Bytes>, String> {
    let cannot = |e: &dyn std::fmt::Display| format!("cannot connect to {target}: {e}");
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target))
        .await
        .map_err(|e| cannot(&e))?
        .map_err(|e| cannot(&e))?;
    tcp.set_nodelay(true).map_err(|e| cannot(&e))?;
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .max_header_list_size(MAX_HEADER_LIST)
        .handshake(tcp)
        .await
        .map_err(|e| cannot(&e))?;
    // The connection's own task: it reads frames and writes what the streams queue. A call
    // on a connection that ended fails, so its outcome needs no other handling.
    tokio::spawn(async move { drop(connection.await) });
    Ok(send)
}

async fn connect_tonic(target: &str) -> Result<tonic::client::Grpc<Channel>, String> {
    let channel = Endpoint::from_shared(format!("http://{target}"))
        .map_err(|e| format!("bad target {target:?}: {e}"))?
        .tcp_nodelay(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {target}: {e}"))?;
    Ok(tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_MESSAGE))
}

async fn call_h2(
    send: &mut h2::client::SendRequest<Bytes>,
    uri: &http::Uri,
) -> Result<usize, String> {
    let request = http::Request::post(uri.clone())
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    *send = send.clone().ready().await.map_err(|e| e.to_string())?;
    let (response, mut request_body) = send
        .send_request(request, false)
        .map_err(|e| e.to_string())?;
    request_body
        .send_data(Bytes::from_static(&EMPTY_REQUEST), true)
        .map_err(|e| e.to_string())?;
    let response = response.await.map_err(|e| e.to_string())?;
    if response.status() != http::StatusCode::OK {
        return Err(format!("HTTP status {}", response.status()));
    }
    if grpc_ok(response.headers())? {
        return Err("trailers-only reply without a message".into());
    }
    let mut body = response.into_body();
    let (mut prefix, mut received) = (MessagePrefix::default(), 0usize);
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        // Counted and dropped at once: the window reopens as a frame is read, and no reply is
        // ever held whole.
        body.flow_control()
            .release_capacity(chunk.len())
            .map_err(|e| e.to_string())?;
        prefix.feed(&chunk);
        received += chunk.len();
    }
    let trailers = body.trailers().await.map_err(|e| e.to_string())?;
    if !grpc_ok(&trailers.unwrap_or_default())? {
        return Err("reply ended without grpc-status".into());
    }
    let len = prefix.message_len()?;
    if received != EMPTY_REQUEST.len() + len {
        return Err(format!(
            "prefix declares {len} bytes, {received} arrived with it"
        ));
    }
    Ok(len)
}

async fn call_tonic(grpc: &mut tonic::client::Grpc<Channel>) -> Result<usize, Status> {
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let path = PathAndQuery::from_static(GET_SERVER_INFO);
    let response = grpc.unary(Request::new(()), path, CountingCodec).await?;
    Ok(response.into_inner())
}

async fn run_client(
    mut caller: Caller,
    measure_from: Instant,
    measure_until: Instant,
    expect_bytes: Option<usize>,
    calls: Option<u64>,
) -> ClientResult {
    let mut result = ClientResult::default();
    let mut made = 0u64;
    loop {
        let started = Instant::now();
        if calls.map_or(started >= measure_until, |calls| made >= calls) {
            return result;
        }
        made += 1;
        let outcome = caller.call().await;
        let ended = Instant::now();
        if started < measure_from || ended > measure_until {
            continue;
        }
        match outcome {
            Ok(len) => {
                result.response_bytes = len;
                if expect_bytes.is_some_and(|want| want != len) {
                    result.wrong_size += 1;
                }
                result
                    .latencies_ns
                    .push((ended - started).as_nanos() as u64);
            }
            Err(error) => {
                result.errors += 1;
                result.first_error.get_or_insert(error);
            }
        }
    }
}

fn percentile_us(sorted_ns: &[u64], q: f64) -> f64 {
    if sorted_ns.is_empty() {
        return f64::NAN;
    }
    // Nearest rank: the smallest value with at least q of the samples at or below it.
    let rank = (q * sorted_ns.len() as f64).ceil().max(1.0) as usize;
    sorted_ns[rank.min(sorted_ns.len()) - 1] as f64 / 1000.0
}

async fn run(args: Args) -> Result<serde_json::Value, String> {
    let mut callers = Vec::with_capacity(args.concurrency);
    for _ in 0..args.concurrency {
        callers.push(Caller::connect(args.client, &args.target).await?);
    }
    let started = Instant::now();
    let (measure_from, measure_until) = match args.calls {
        // Every call counts, however long the soak takes.
        Some(_) => (started, started + Duration::from_secs(86_400 * 365)),
        None => (started + args.warmup, started + args.warmup + args.duration),
    };
    let (expect, calls) = (args.expect_bytes, args.calls);
    let tasks: Vec<_> = callers
        .into_iter()
        .map(|caller| {
            tokio::spawn(run_client(
                caller,
                measure_from,
                measure_until,
                expect,
                calls,
            ))
        })
        .collect();
    let mut latencies = Vec::new();
    let (mut errors, mut wrong_size, mut response_bytes) = (0u64, 0u64, 0usize);
    let mut first_error = None;
    for task in tasks {
        let mut r = task.await.map_err(|e| format!("client task failed: {e}"))?;
        latencies.append(&mut r.latencies_ns);
        errors += r.errors;
        wrong_size += r.wrong_size;
        response_bytes = response_bytes.max(r.response_bytes);
        first_error = first_error.or(r.first_error);
    }
    latencies.sort_unstable();
    let seconds = match args.calls {
        Some(_) => started.elapsed().as_secs_f64(),
        None => args.duration.as_secs_f64(),
    };
    let mean_us = if latencies.is_empty() {
        f64::NAN
    } else {
        latencies.iter().sum::<u64>() as f64 / latencies.len() as f64 / 1000.0
    };
    Ok(serde_json::json!({
        "target": args.target,
        "concurrency": args.concurrency,
        "client_threads": args.threads,
        "client": args.client.name(),
        "seconds": seconds,
        "requests": latencies.len(),
        "errors": errors,
        "first_error": first_error,
        "wrong_size": wrong_size,
        "response_bytes": response_bytes,
        "rps": latencies.len() as f64 / seconds,
        "mean_us": mean_us,
        "p50_us": percentile_us(&latencies, 0.50),
        "p90_us": percentile_us(&latencies, 0.90),
        "p99_us": percentile_us(&latencies, 0.99),
        "max_us": latencies.last().map_or(f64::NAN, |&ns| ns as f64 / 1000.0),
    }))
}

/// Large buffers come from the heap and freed memory stays with it. Without this, glibc maps
/// each buffer above its (adaptive) threshold on its own and trims the heap's top when it is
/// freed, so every reply's pages are faulted in anew.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_heap() {
    const LARGEST_MAPPED_ALONE: libc::c_int = 32 * 1024 * 1024;
    const TRIM_ABOVE: libc::c_int = 256 * 1024 * 1024;
    // SAFETY: mallopt only sets allocator parameters; it is called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, LARGEST_MAPPED_ALONE);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_ABOVE);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_heap() {}

fn main() -> ExitCode {
    keep_heap();
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("bench-client: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("bench-client: cannot build the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("bench-client: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Args, String> {
        parse_args(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_every_option() {
        let a = args(&[
            "--target",
            "127.0.0.1:5",
            "--concurrency",
            "16",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--threads",
            "2",
            "--expect-bytes",
            "20480",
            "--calls",
            "7",
            "--client",
            "tonic",
        ])
        .unwrap();
        assert_eq!(a.target, "127.0.0.1:5");
        assert_eq!(a.concurrency, 16);
        assert_eq!(a.duration, Duration::from_millis(500));
        assert_eq!(a.warmup, Duration::ZERO);
        assert_eq!(a.threads, 2);
        assert_eq!(a.expect_bytes, Some(20480));
        assert_eq!(a.calls, Some(7));
        assert_eq!(a.client, ClientKind::Tonic);
        assert_eq!(args(&["--target", "h:1"]).unwrap().client, ClientKind::H2);
    }

    #[test]
    fn rejects_missing_target_and_unknown_flags() {
        assert!(args(&[]).unwrap_err().contains("--target"));
        assert!(args(&["--target", "h:1", "--bogus", "1"]).is_err());
        assert!(args(&["--target"]).unwrap_err().contains("needs a value"));
        assert!(args(&["--target", "h:1", "--concurrency", "0"]).is_err());
        let bad = args(&["--target", "h:1", "--client", "grpcio"]).unwrap_err();
        assert!(bad.contains("\"grpcio\""), "{bad}");
    }

    #[test]
    fn message_prefix_across_chunks() {
        let mut prefix = MessagePrefix::default();
        prefix.feed(&[0, 0]);
        assert!(prefix.message_len().unwrap_err().contains("2 bytes"));
        prefix.feed(&[0x10, 0x00, 0x00, 0xff, 0xff]);
        assert_eq!(prefix.message_len(), Ok(0x10_0000));
        let mut compressed = MessagePrefix::default();
        compressed.feed(&[1, 0, 0, 0, 0]);
        assert!(compressed.message_len().unwrap_err().contains("compressed"));
    }

    #[test]
    fn grpc_status_of_a_header_block() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(grpc_ok(&headers), Ok(false));
        headers.insert("grpc-status", http::HeaderValue::from_static("0"));
        assert_eq!(grpc_ok(&headers), Ok(true));
        headers.insert("grpc-status", http::HeaderValue::from_static("14"));
        headers.insert("grpc-message", http::HeaderValue::from_static("gone"));
        let error = grpc_ok(&headers).unwrap_err();
        assert!(error.contains("14") && error.contains("gone"), "{error}");
    }

    #[test]
    fn nearest_rank_percentiles() {
        let ns: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile_us(&ns, 0.50), 50.0);
        assert_eq!(percentile_us(&ns, 0.99), 99.0);
        assert_eq!(percentile_us(&ns[..1], 0.99), 1.0);
        assert!(percentile_us(&[], 0.5).is_nan());
    }
}
