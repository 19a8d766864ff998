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

#[cfg(test)]
mod tests {
    use http_body::Body as _;
    use http_body_util::{BodyExt, Full};

    use super::*;

    /// Passes the first `keep` bytes of a chunk, then holds the refusal for the next poll.
    struct KeepThenRefuse {
        keep: usize,
        pending: Option<Status>,
    }

    impl FrameFilter for KeepThenRefuse {
        fn frame(&mut self, frame: Frame<Bytes>) -> Result<Frame<Bytes>, Status> {
            let data = frame.into_data().expect("a data frame");
            self.pending = Some(Status::resource_exhausted("past the limit"));
            Ok(Frame::data(data.slice(..self.keep)))
        }

        fn held_back(&mut self) -> Option<Status> {
            self.pending.take()
        }

        fn holds_back(&self) -> bool {
            self.pending.is_some()
        }
    }

    struct Refuse;

    impl FrameFilter for Refuse {
        fn frame(&mut self, _frame: Frame<Bytes>) -> Result<Frame<Bytes>, Status> {
            Err(Status::invalid_argument("refused"))
        }
    }

    fn body(text: &'static str) -> Body {
        Body::new(Full::new(Bytes::from_static(text.as_bytes())))
    }

    #[tokio::test]
    async fn a_held_back_refusal_comes_after_the_part_passed_on() {
        let filter = KeepThenRefuse {
            keep: 3,
            pending: None,
        };
        let mut filtered = Filtered::new(body("abcdef"), filter);
        let first = filtered.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"abc"));
        // The wrapped body is done, but the refusal is still to come.
        assert!(!filtered.is_end_stream());
        let refusal = filtered.frame().await.unwrap().unwrap_err();
        assert_eq!(refusal.code(), tonic::Code::ResourceExhausted);
        assert!(filtered.frame().await.is_none());
    }

    #[tokio::test]
    async fn a_refused_frame_ends_the_stream_with_the_status() {
        let mut filtered = Filtered::new(body("x"), Refuse);
        let refusal = filtered.frame().await.unwrap().unwrap_err();
        assert_eq!(refusal.code(), tonic::Code::InvalidArgument);
    }
}
