//! Gathers the writes h2 makes on one connection into fewer, larger socket writes.
//!
//! h2 writes each DATA frame on its own (at most the client's frame size, 16 KiB unless the
//! client raises it) and flushes after every one, so a 1 MiB reply costs some 64 `writev`s and
//! as many wake-ups of the reader. A [`WriteBatch`] copies what h2 writes into a buffer of at
//! most [`BATCH_BYTES`] and writes it in one go when it is full or when the connection has
//! nothing more to send:
//!
//! - a flush right after new writes is deferred once: the connection task is woken and polled
//!   again at once, and if h2 had more frames ready they join the batch;
//! - the next flush with no write since (h2 flushes on every poll of the connection, whatever
//!   it did) sends the batch, and so do a full buffer and a shutdown.
//!
//! Writes of at least `BATCH_BYTES` onto an empty buffer go straight to the socket. The buffer
//! is released once a flush has sent it, so an idle connection holds none, and a client that
//! stops reading can make the server hold at most `BATCH_BYTES` of its own per connection.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::AsyncWrite;

/// Largest batch: a receive window's worth, what a connection may already make the server hold.
pub const BATCH_BYTES: usize = 64 * 1024;

#[derive(Debug, Default)]
pub struct WriteBatch {
    buf: Vec<u8>,
    /// Bytes at the front of `buf` already written to the socket.
    sent: usize,
    /// Bytes were added since the last flush, so the next flush may wait for more.
    added_since_flush: bool,
}

impl WriteBatch {
    /// Takes all of `bufs` into the batch, or writes them straight through when they are a
    /// batch on their own; sends the batch first when they would not fit.
    pub fn poll_write_vectored<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if self.pending() + total > BATCH_BYTES {
            ready!(self.poll_send(io, cx))?;
        }
        if total >= BATCH_BYTES {
            return Pin::new(io).poll_write_vectored(cx, bufs);
        }
        self.grow_for(total);
        for b in bufs {
            self.buf.extend_from_slice(b);
        }
        self.added_since_flush |= total > 0;
        Poll::Ready(Ok(total))
    }

    /// Defers the first flush after new writes (see the module docs); otherwise sends the
    /// batch, releases its buffer and flushes `io`.
    pub fn poll_flush<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if std::mem::take(&mut self.added_since_flush) {
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        ready!(self.poll_send(io, cx))?;
        self.buf = Vec::new();
        Pin::new(io).poll_flush(cx)
    }

    /// Sends the batch, then shuts `io` down.
    pub fn poll_shutdown<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        ready!(self.poll_send(io, cx))?;
        Pin::new(io).poll_shutdown(cx)
    }

    /// Room for `more` bytes: doubling, as a `Vec` grows, but never past `BATCH_BYTES`, so
    /// small replies keep small buffers.
    fn grow_for(&mut self, more: usize) {
        let needed = self.buf.len() + more;
        if needed > self.buf.capacity() {
            let target = needed.max(2 * self.buf.capacity()).min(BATCH_BYTES);
            self.buf.reserve_exact(target - self.buf.len());
        }
    }

    fn pending(&self) -> usize {
        self.buf.len() - self.sent
    }

    /// Writes the batch to `io` until it is empty (or `io` is not ready).
    fn poll_send<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while self.pending() > 0 {
            let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.buf[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.buf.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    /// A socket that records each write call, taking at most `accept` bytes per call.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<usize>,
        data: Vec<u8>,
        accept: Option<usize>,
        blocked: bool,
        shut: bool,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            if this.blocked {
                return Poll::Pending;
            }
            let n = this.accept.map_or(buf.len(), |cap| cap.min(buf.len()));
            this.writes.push(n);
            this.data.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().shut = true;
            Poll::Ready(Ok(()))
        }
    }

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);
    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<CountingWaker>, Waker) {
        let counter = Arc::new(CountingWaker::default());
        (counter.clone(), Waker::from(counter))
    }

    /// What h2 does for one DATA frame: a 9-byte head and the payload, then a flush.
    fn write_frame(
        batch: &mut WriteBatch,
        io: &mut Recorder,
        cx: &mut Context<'_>,
        payload: &[u8],
    ) {
        let head = [0u8; 9];
        let bufs = [IoSlice::new(&head), IoSlice::new(payload)];
        let n = batch.poll_write_vectored(io, cx, &bufs);
        assert!(matches!(n, Poll::Ready(Ok(n)) if n == 9 + payload.len()));
        assert!(batch.poll_flush(io, cx).is_ready());
    }

    #[test]
    fn frames_flushed_one_by_one_leave_in_few_writes_and_in_order() {
        let (_, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let (mut batch, mut io) = (WriteBatch::default(), Recorder::default());
        let mut expected = Vec::new();
        for i in 0..64u8 {
            let payload = vec![i; 16 * 1024];
            write_frame(&mut batch, &mut io, &mut cx, &payload);
            expected.extend_from_slice(&[0u8; 9]);
            expected.extend_from_slice(&payload);
        }
        // The flush of a poll that added nothing sends what is left.
        assert!(batch.poll_flush(&mut io, &mut cx).is_ready());
        assert_eq!(io.data, expected);
        assert!(
            io.writes.len() <= 22,
            "{} writes for 64 frames",
            io.writes.len()
        );
        assert!(io.writes.iter().all(|&n| n <= BATCH_BYTES));
        assert!(batch.buf.capacity() <= BATCH_BYTES);
        assert_eq!(batch.buf.capacity(), 0, "the buffer is released once sent");
    }

    #[test]
    fn the_first_flush_after_writes_wakes_the_task_and_the_next_one_sends() {
        let (woken, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let (mut batch, mut io) = (WriteBatch::default(), Recorder::default());
        let bufs = [IoSlice::new(b"trailers")];
        assert!(
            batch
                .poll_write_vectored(&mut io, &mut cx, &bufs)
                .is_ready()
        );
        assert!(batch.poll_flush(&mut io, &mut cx).is_ready());
        assert!(io.data.is_empty());
        assert_eq!(
            woken.0.load(Ordering::SeqCst),
            1,
            "deferred without a wake-up: a stall"
        );
        assert!(batch.poll_flush(&mut io, &mut cx).is_ready());
        assert_eq!(io.data, b"trailers");
    }

    #[test]
    fn a_small_reply_keeps_a_small_buffer() {
        let (_, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let (mut batch, mut io) = (WriteBatch::default(), Recorder::default());
        let reply = vec![3u8; 4096];
        let bufs = [IoSlice::new(&reply)];
        assert!(
            batch
                .poll_write_vectored(&mut io, &mut cx, &bufs)
                .is_ready()
        );
        assert!(
            batch.buf.capacity() < 2 * reply.len(),
            "{}",
            batch.buf.capacity()
        );
    }

    #[test]
    fn a_write_of_a_whole_batch_goes_straight_through() {
        let (_, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let (mut batch, mut io) = (WriteBatch::default(), Recorder::default());
        let big = vec![7u8; BATCH_BYTES];
        let bufs = [IoSlice::new(&big)];
        assert!(matches!(
            batch.poll_write_vectored(&mut io, &mut cx, &bufs),
            Poll::Ready(Ok(n)) if n == BATCH_BYTES
        ));
        assert_eq!(io.writes, vec![BATCH_BYTES]);
        assert_eq!(batch.buf.capacity(), 0);
    }

    #[test]
    fn a_reader_that_stops_reading_leaves_at_most_one_batch_held() {
        let (_, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let (mut batch, mut io) = (WriteBatch::default(), Recorder::default());
        io.blocked = true;
        let payload = vec![1u8; 16 * 1024];
        let bufs = [IoSlice::new(&payload)];
        let mut taken = 0;
        for _ in 0..100 {
            match batch.poll_write_vectored(&mut io, &mut cx, &bufs) {
                Poll::Ready(Ok(n)) => taken += n,
                Poll::Pending => break,
                Poll::Ready(Err(err)) => panic!("{err}"),
            }
        }
        assert!(
            taken <= BATCH_BYTES,
            "took {taken} bytes from a blocked socket"
        );
        assert!(batch.buf.capacity() <= BATCH_BYTES);
        // Partial writes once it reads again still deliver every byte, in order.
        io.blocked = false;
        io.accept = Some(1000);
        assert!(batch.poll_flush(&mut io, &mut cx).is_ready());
        assert!(batch.poll_flush(&mut io, &mut cx).is_ready());
        assert_eq!(io.data.len(), taken);
    }

    #[test]
    fn shutdown_sends_the_batch_first() {
        let (_, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let (mut batch, mut io) = (WriteBatch::default(), Recorder::default());
        let bufs = [IoSlice::new(b"goaway")];
        assert!(
            batch
                .poll_write_vectored(&mut io, &mut cx, &bufs)
                .is_ready()
        );
        assert!(batch.poll_shutdown(&mut io, &mut cx).is_ready());
        assert_eq!(io.data, b"goaway");
        assert!(io.shut);
    }
}
