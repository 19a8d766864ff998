//! Accepting connections within bounds, before tonic and hyper see them.
//!
//! One accept task owns the listener. Each accepted socket must first take a permit from a
//! semaphore of `max_connections` (a socket that finds none is closed at once, so a flood
//! costs an accept and a close, never memory), then send the 24-byte HTTP/2 client preface
//! within `handshake_timeout`, or it is closed: garbage, HTTP/1.1 and clients that trickle
//! or send nothing never reach hyper. The permit travels inside [`Conn`] and is returned when
//! hyper drops the connection, however that happens.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::write_batch::WriteBatch;

/// What every HTTP/2 client sends first (RFC 9113 §3.4).
pub const HTTP2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Pause after an accept error that is not about one connection (EMFILE, ENFILE, ENOBUFS):
/// retrying at once would spin a core while the process is out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Handshaken connections waiting for tonic to pick them up.
const READY_QUEUE: usize = 64;

/// The largest TCP_KEEPIDLE (and TCP_KEEPINTVL) Linux takes.
const MAX_TCP_KEEPIDLE: Duration = Duration::from_secs(32767);

#[derive(Debug, Clone)]
pub struct AcceptLimits {
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    pub tcp_keepalive: Duration,
}

/// An accepted connection that sent a valid preface and holds one connection permit. Its
/// writes go out in batches ([`WriteBatch`]).
pub struct Conn {
    stream: TcpStream,
    /// How much of the (already read and checked) preface hyper has been handed back so far.
    replayed: usize,
    batch: WriteBatch,
    _permit: OwnedSemaphorePermit,
}

/// Starts the accept task on the current runtime; it stops when `stop` turns true or the
/// returned stream is dropped, closing the listener.
pub fn bounded_incoming(
    listener: TcpListener,
    limits: AcceptLimits,
    stop: watch::Receiver<bool>,
) -> ReceiverStream<io::Result<Conn>> {
    let (ready_tx, ready_rx) = mpsc::channel(READY_QUEUE);
    tokio::spawn(accept_loop(listener, limits, stop, ready_tx));
    ReceiverStream::new(ready_rx)
}

async fn accept_loop(
    listener: TcpListener,
    limits: AcceptLimits,
    mut stop: watch::Receiver<bool>,
    ready: mpsc::Sender<io::Result<Conn>>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    // Linux takes whole seconds from 1 to 32767 and refuses the call outside them, which
    // would leave its two-hour default: clamp rather than let a valid limit be dropped.
    let idle = limits
        .tcp_keepalive
        .clamp(Duration::from_secs(1), MAX_TCP_KEEPIDLE);
    let keepalive = TcpKeepalive::new()
        .with_time(idle)
        .with_interval((idle / 4).max(Duration::from_secs(1)))
        .with_retries(4);
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => return,
            _ = ready.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(err) if is_per_connection(&err) => continue,
            Err(_) => {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Over the cap: closing now frees the descriptor and tells the client at once.
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let _ = SockRef::from(&stream).set_tcp_keepalive(&keepalive);
        let ready = ready.clone();
        let handshake_timeout = limits.handshake_timeout;
        tokio::spawn(async move {
            if let Some(conn) = handshake(stream, permit, handshake_timeout).await {
                let _ = ready.send(Ok(conn)).await;
            }
        });
    }
}

/// Errors that concern only the connection being accepted; the listener is fine.
fn is_per_connection(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

/// Reads exactly the preface: nothing after it is consumed, so hyper sees the stream whole.
async fn handshake(
    mut stream: TcpStream,
    permit: OwnedSemaphorePermit,
    timeout: Duration,
) -> Option<Conn> {
    let mut preface = [0u8; HTTP2_PREFACE.len()];
    match tokio::time::timeout(timeout, stream.read_exact(&mut preface)).await {
        Ok(Ok(_)) if &preface == HTTP2_PREFACE => Some(Conn {
            stream,
            replayed: 0,
            batch: WriteBatch::default(),
            _permit: permit,
        }),
        _ => None,
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.replayed < HTTP2_PREFACE.len() {
            let rest = &HTTP2_PREFACE[this.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.batch
            .poll_write_vectored(&mut this.stream, cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.batch.poll_write_vectored(&mut this.stream, cx, bufs)
    }

    /// Vectored, so h2 hands its frames over without copying them first.
    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.batch.poll_flush(&mut this.stream, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.batch.poll_shutdown(&mut this.stream, cx)
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}
