//! The follower metadata server: `SglangService/GetServerInfo` plus `grpc.health.v1.Health`,
//! and gRPC server reflection over those two unless switched off.
//!
//! Each server owns a small multi-thread tokio runtime (`ServerOptions::worker_threads`
//! workers) driven from one server thread of its own. It binds in the caller's thread (so bind
//! errors surface at once), answers GetServerInfo with one immutable JSON snapshot, and stops
//! within `ServerOptions::shutdown_grace` even while clients hold streams open (health Watch
//! streams never end on their own).

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::runtime::{Handle, Runtime};
use tokio::sync::watch;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::SGLANG_SERVICE;
use crate::incoming::{AcceptLimits, bounded_incoming};
use crate::limits::Limits;
use crate::service::{Implementation, SnapshotService, generated_service};

/// Health is reported under both the overall ("") and the SGLang service name.
const HEALTH_SERVICES: [&str; 2] = ["", SGLANG_SERVICE];

/// HTTP/2 receive windows. Legitimate requests are a few bytes, so 64 KiB per stream and per
/// connection caps what a client can make the server hold before it reads:
/// `max_connections` × 64 KiB in total.
const RECEIVE_WINDOW: u32 = 64 * 1024;
/// RST_STREAMs this server may send on one connection because of client errors before it
/// answers with GOAWAY (tonic passes None, which would leave this unbounded).
const MAX_LOCAL_ERROR_RESETS: usize = 1024;
/// Streams a client may open and reset before the server reads them (rapid reset).
const MAX_PENDING_ACCEPT_RESETS: usize = 20;

#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Two by default. One was tried on the 2-core benchmark machine (with batched writes):
    /// better at 20 KB × 16 clients, worse at 20 KB × 64 and at 1 MiB, within run-to-run noise
    /// of ±25%, so the default stayed.
    pub worker_threads: usize,
    /// How long in-flight calls may finish after shutdown begins before connections are cut.
    pub shutdown_grace: Duration,
    pub limits: Limits,
    /// Which SglangService implementation answers (the benchmark compares them).
    pub implementation: Implementation,
    /// Serve gRPC server reflection (v1 and v1alpha; see [`crate::reflection`]).
    pub reflection: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            worker_threads: 2,
            shutdown_grace: Duration::from_millis(500),
            limits: Limits::default(),
            implementation: Implementation::default(),
            reflection: true,
        }
    }
}

#[derive(Debug)]
pub enum StartError {
    /// The snapshot is not a JSON object; consumers could not parse it.
    InvalidJson(String),
    Bind {
        addr: SocketAddr,
        source: io::Error,
    },
    Runtime(io::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidJson(reason) => {
                write!(f, "server_info_json is not a JSON object: {reason}")
            }
            Self::Bind { addr, source } => {
                write!(f, "cannot bind metadata server to {addr}: {source}")
            }
            Self::Runtime(source) => {
                write!(f, "cannot start the metadata server runtime: {source}")
            }
        }
    }
}

impl std::error::Error for StartError {}

/// Rejects anything a consumer's JSON-object parser would reject, including nesting deeper
/// than serde_json's recursion limit of 128 (which Rust consumers parse with). The error quotes
/// the start of the value (at most 40 characters), so a caller sees what it passed.
pub fn validate_snapshot(json: &str) -> Result<(), StartError> {
    let invalid = |reason: String| {
        let start: String = json.chars().take(40).collect();
        let more = if start.len() < json.len() { "..." } else { "" };
        StartError::InvalidJson(format!("{start:?}{more}: {reason}"))
    };
    if !json.trim_start().starts_with('{') {
        return Err(invalid("the top-level value must be an object".into()));
    }
    // A full `Value`, not `IgnoredAny`: only the former enforces the recursion limit.
    serde_json::from_str::<serde_json::Value>(json)
        .map(|_| ())
        .map_err(|err| invalid(err.to_string()))
}

/// A running metadata server. Dropping it shuts it down.
pub struct MetadataServer {
    local_addr: SocketAddr,
    runtime: Handle,
    health: HealthReporter,
    stop: watch::Sender<bool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl MetadataServer {
    /// Validates the snapshot, binds `addr` and starts serving before returning.
    /// Health starts NOT_SERVING; call [`MetadataServer::set_serving`] once the node is ready.
    pub fn start(
        addr: SocketAddr,
        snapshot: String,
        options: &ServerOptions,
    ) -> Result<Self, StartError> {
        validate_snapshot(&snapshot)?;
        let listener = bind(addr)?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| StartError::Bind { addr, source })?;
        let runtime = build_runtime(options.worker_threads)?;
        let limits = options.limits.clone();
        let (health, health_service) = tonic_health::server::health_reporter();
        let health_service = health_service.max_decoding_message_size(limits.max_message_bytes);
        let (stop, stop_rx) = watch::channel(false);
        let implementation = options.implementation;
        let reflection = options.reflection;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
                .map_err(|source| StartError::Bind { addr, source })?
        };
        let accept_limits = AcceptLimits {
            max_connections: limits.max_connections,
            handshake_timeout: limits.handshake_timeout,
            tcp_keepalive: limits.tcp_keepalive,
        };
        let grace = options.shutdown_grace;
        let handle = runtime.handle().clone();
        let initial_health = health.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("overlay-grpc".into())
            .spawn(move || {
                let (max_request, max_message) =
                    (limits.max_request_bytes, limits.max_message_bytes);
                let mut router = bounded_builder(&limits).add_service(health_service);
                router = match implementation {
                    Implementation::Framed => {
                        router.add_service(SnapshotService::new(snapshot, max_request, max_message))
                    }
                    Implementation::Generated => {
                        router.add_service(generated_service(snapshot, max_request, max_message))
                    }
                };
                if reflection {
                    let (v1, v1alpha) = crate::reflection::services(max_message);
                    router = router.add_service(v1).add_service(v1alpha);
                }
                runtime.block_on(async move {
                    // tonic-health starts "" as SERVING; flip it before the first accept, and
                    // before start() returns so a set_serving(true) cannot be overwritten.
                    set_status(&initial_health, ServingStatus::NotServing).await;
                    let incoming = bounded_incoming(listener, accept_limits, stop_rx.clone());
                    let _ = ready_tx.send(());
                    serve_until_stopped(router, incoming, stop_rx, grace).await;
                });
                // Connection tasks still running after the grace period are cut here.
                runtime.shutdown_timeout(Duration::from_millis(100));
            })
            .map_err(StartError::Runtime)?;
        let _ = ready_rx.recv();

        Ok(Self {
            local_addr,
            runtime: handle,
            health,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn is_alive(&self) -> bool {
        self.thread
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .as_ref()
            .is_some_and(|thread| !thread.is_finished())
    }

    /// Drives grpc.health.v1 for "" and the SGLang service name. No-op after shutdown.
    pub fn set_serving(&self, serving: bool) {
        if !self.is_alive() {
            return;
        }
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.report(status);
    }

    /// Sets the health status and waits until watchers are told. Runs on a scoped thread so it
    /// also works from inside another tokio runtime (`block_on` there would panic, and a panic
    /// in `Drop` while unwinding aborts the process).
    fn report(&self, status: ServingStatus) {
        std::thread::scope(|scope| {
            scope.spawn(|| self.runtime.block_on(set_status(&self.health, status)));
        });
    }

    /// Stops serving and waits for the server thread. Idempotent and safe from any thread;
    /// returns within the shutdown grace period plus a small margin.
    pub fn shutdown(&self) {
        // The lock is held until the server thread has ended, so `is_alive()` turns false
        // only once nothing listens any more (it waits for a stop in progress).
        let mut slot = self
            .thread
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let Some(thread) = slot.take() else { return };
        if !thread.is_finished() {
            // Watchers learn the node is going away before their stream is closed.
            self.report(ServingStatus::NotServing);
        }
        self.stop.send_replace(true);
        let _ = thread.join();
    }
}

impl Drop for MetadataServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The HTTP/2 side of the limits; the accept side lives in [`crate::incoming`].
fn bounded_builder(limits: &Limits) -> Server {
    Server::builder()
        .max_concurrent_streams(limits.max_concurrent_streams)
        .http2_max_header_list_size(limits.max_header_list_bytes)
        .timeout(limits.request_timeout)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .initial_stream_window_size(RECEIVE_WINDOW)
        .initial_connection_window_size(RECEIVE_WINDOW)
        .http2_adaptive_window(Some(false))
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESETS))
}

fn bind(addr: SocketAddr) -> Result<StdTcpListener, StartError> {
    let listener =
        StdTcpListener::bind(addr).map_err(|source| StartError::Bind { addr, source })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| StartError::Bind { addr, source })?;
    Ok(listener)
}

fn build_runtime(worker_threads: usize) -> Result<Runtime, StartError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads.max(1))
        .thread_name("overlay-grpc-worker")
        .enable_io()
        .enable_time()
        .build()
        .map_err(StartError::Runtime)
}

async fn set_status(health: &HealthReporter, status: ServingStatus) {
    for service in HEALTH_SERVICES {
        health.set_service_status(service, status).await;
    }
}

async fn serve_until_stopped(
    router: tonic::transport::server::Router,
    incoming: impl tokio_stream::Stream<Item = io::Result<crate::incoming::Conn>>,
    stop: watch::Receiver<bool>,
    grace: Duration,
) {
    let mut graceful_stop = stop.clone();
    let serve = router.serve_with_incoming_shutdown(incoming, async move {
        let _ = graceful_stop.wait_for(|stopped| *stopped).await;
    });
    let mut hard_stop = stop;
    let deadline = async move {
        let _ = hard_stop.wait_for(|stopped| *stopped).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        _ = serve => {}
        _ = deadline => {}
    }
}
