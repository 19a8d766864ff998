//! One body wrapper for every limit that watches a stream frame by frame.
//!
//! The request caps (GetServerInfo's `max_request_bytes`, reflection's per-stream count) and
//! the reflection reply that carries a refusal in its trailers all do the same thing: poll the
//! wrapped body and hand each frame to a rule that passes it on, changes it, or refuses the
//! stream. [`Filtered`] is that poll; each rule is a [`FrameFilter`].

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use tonic::Status;
use tonic::body::Body;

/// What a wrapper does with the frames of the body it wraps.
pub trait FrameFilter: Unpin {
    /// Each frame the wrapped body gives: passed on (possibly changed), or the stream refused.
    fn frame(&mut self, frame: Frame<Bytes>) -> Result<Frame<Bytes>, Status>;

    /// A refusal held back from an earlier frame, given before the wrapped body is polled again.
    fn held_back(&mut self) -> Option<Status> {
        None
    }

    /// Whether a refusal is held back (the stream has not ended, whatever the body says).
    fn holds_back(&self) -> bool {
        false
    }
}

/// A body whose frames pass through `filter` on their way out.
pub struct Filtered<F> {
    inner: Body,
    filter: F,
}

impl<F> Filtered<F> {
    pub fn new(inner: Body, filter: F) -> Self {
        Self { inner, filter }
    }
}

impl<F: FrameFilter> http_body::Body for Filtered<F> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(status) = this.filter.held_back() {
            return Poll::Ready(Some(Err(status)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(this.filter.frame(frame))),
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        !self.filter.holds_back() && self.inner.is_end_stream()
    }
}
