//! Closed-loop load generator for `sglang.runtime.v1.SglangService/GetServerInfo`.
//!
//! N clients, each on its own HTTP/2 connection, call GetServerInfo back to back for a warm-up
//! period and then for a measured period; only calls that start and end inside the measured
//! period count. The response is counted, not decoded, so the client spends its CPU on the
//! transport alone: on a small machine the client shares cores with the server under test, and
//! a cheaper client keeps the comparison about the servers.
//!
//! With `--calls N` each client instead makes exactly N calls, every one counted (a soak: the
//! duration and warm-up are ignored).
//!
//! Prints one JSON object: throughput, latency percentiles, bytes per response, errors.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Buf;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

const GET_SERVER_INFO: &str = "/sglang.runtime.v1.SglangService/GetServerInfo";
const MAX_MESSAGE: usize = 64 * 1024 * 1024;

const USAGE: &str = "usage: bench-client --target HOST:PORT [--concurrency N] [--duration SECS] \
[--warmup SECS] [--threads N] [--expect-bytes N] [--calls N]";

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

async fn call(grpc: &mut tonic::client::Grpc<Channel>) -> Result<usize, Status> {
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let path = PathAndQuery::from_static(GET_SERVER_INFO);
    let response = grpc.unary(Request::new(()), path, CountingCodec).await?;
    Ok(response.into_inner())
}

async fn run_client(
    channel: Channel,
    measure_from: Instant,
    measure_until: Instant,
    expect_bytes: Option<usize>,
    calls: Option<u64>,
) -> ClientResult {
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_MESSAGE);
    let mut result = ClientResult::default();
    let mut made = 0u64;
    loop {
        let started = Instant::now();
        if calls.map_or(started >= measure_until, |calls| made >= calls) {
            return result;
        }
        made += 1;
        let outcome = call(&mut grpc).await;
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
            Err(status) => {
                result.errors += 1;
                result.first_error.get_or_insert_with(|| status.to_string());
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
    let endpoint = Endpoint::from_shared(format!("http://{}", args.target))
        .map_err(|e| format!("bad target {:?}: {e}", args.target))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5));
    let mut channels = Vec::with_capacity(args.concurrency);
    for _ in 0..args.concurrency {
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", args.target))?;
        channels.push(channel);
    }
    let started = Instant::now();
    let (measure_from, measure_until) = match args.calls {
        // Every call counts, however long the soak takes.
        Some(_) => (started, started + Duration::from_secs(86_400 * 365)),
        None => (started + args.warmup, started + args.warmup + args.duration),
    };
    let (expect, calls) = (args.expect_bytes, args.calls);
    let tasks: Vec<_> = channels
        .into_iter()
        .map(|ch| tokio::spawn(run_client(ch, measure_from, measure_until, expect, calls)))
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

fn main() -> ExitCode {
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
        ])
        .unwrap();
        assert_eq!(a.target, "127.0.0.1:5");
        assert_eq!(a.concurrency, 16);
        assert_eq!(a.duration, Duration::from_millis(500));
        assert_eq!(a.warmup, Duration::ZERO);
        assert_eq!(a.threads, 2);
        assert_eq!(a.expect_bytes, Some(20480));
        assert_eq!(a.calls, Some(7));
    }

    #[test]
    fn rejects_missing_target_and_unknown_flags() {
        assert!(args(&[]).unwrap_err().contains("--target"));
        assert!(args(&["--target", "h:1", "--bogus", "1"]).is_err());
        assert!(args(&["--target"]).unwrap_err().contains("needs a value"));
        assert!(args(&["--target", "h:1", "--concurrency", "0"]).is_err());
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
