//! `sglang.runtime.v1.SglangService` for a follower: GetServerInfo and nothing else.
//!
//! The snapshot never changes while the server runs, so the whole gRPC reply (length-prefixed
//! `GetServerInfoResponse`) is encoded once at start-up and every call hands out a reference
//! to the same bytes: no per-call allocation, encoding or copy, which is what dominates with
//! megabyte snapshots. Every other method answers UNIMPLEMENTED.
//!
//! The request (an empty message) is read frame by frame and counted, never collected: a body
//! larger than `max_request_bytes`, or a message header announcing more than
//! `max_message_bytes`, is answered RESOURCE_EXHAUSTED at once and the rest is not read.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use prost::Message;
use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;
use tower_service::Service;

use crate::SGLANG_SERVICE;
use crate::proto::GetServerInfoResponse;

const GET_SERVER_INFO: &str = "/sglang.runtime.v1.SglangService/GetServerInfo";

/// Serves one immutable server-info snapshot.
#[derive(Clone)]
pub struct SnapshotService {
    framed_reply: Bytes,
    max_request_bytes: usize,
    max_message_bytes: usize,
}

impl SnapshotService {
    pub fn new(json_info: String, max_request_bytes: usize, max_message_bytes: usize) -> Self {
        let message = GetServerInfoResponse { json_info };
        let mut frame = BytesMut::with_capacity(5 + message.encoded_len());
        frame.put_u8(0); // not compressed
        frame.put_u32(message.encoded_len() as u32);
        message
            .encode(&mut frame)
            .expect("buffer sized to the message");
        Self {
            framed_reply: frame.freeze(),
            max_request_bytes,
            max_message_bytes,
        }
    }
}

impl NamedService for SnapshotService {
    const NAME: &'static str = SGLANG_SERVICE;
}

impl Service<Request<Body>> for SnapshotService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if request.uri().path() != GET_SERVER_INFO {
            let status = tonic::Status::unimplemented("metadata-only follower: GetServerInfo only");
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let reply = self.framed_reply.clone();
        let mut reader = RequestReader::new(self.max_request_bytes, self.max_message_bytes);
        Box::pin(async move {
            // The (empty) request is read to its end so the stream closes normally rather
            // than being reset under a client that is still sending, unless it breaks a limit.
            let mut body = request.into_body();
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else {
                    // The client reset the stream; nobody reads this answer.
                    return Ok(Status::cancelled("request body aborted").into_http());
                };
                if let Ok(data) = frame.into_data()
                    && let Err(status) = reader.feed(data)
                {
                    return Ok(status.into_http());
                }
            }
            match reader.finish() {
                Ok(()) => Ok(ok_response(reply)),
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

/// Follows the gRPC length-prefixed framing of a request body while counting it, so limits
/// are enforced on the first frame that crosses them and message bodies are never buffered.
#[derive(Debug)]
pub struct RequestReader {
    max_request_bytes: usize,
    max_message_bytes: usize,
    seen: usize,
    header: [u8; 5],
    header_len: usize,
    /// Bytes of the current message body still to skip.
    remaining: usize,
}

impl RequestReader {
    pub fn new(max_request_bytes: usize, max_message_bytes: usize) -> Self {
        Self {
            max_request_bytes,
            max_message_bytes,
            seen: 0,
            header: [0; 5],
            header_len: 0,
            remaining: 0,
        }
    }

    pub fn feed(&mut self, mut data: Bytes) -> Result<(), Status> {
        self.seen = self.seen.saturating_add(data.len());
        if self.seen > self.max_request_bytes {
            return Err(Status::resource_exhausted(format!(
                "GetServerInfo request body exceeds {} bytes (max_request_bytes)",
                self.max_request_bytes
            )));
        }
        while data.has_remaining() {
            if self.remaining > 0 {
                let skip = self.remaining.min(data.remaining());
                data.advance(skip);
                self.remaining -= skip;
                continue;
            }
            let take = (5 - self.header_len).min(data.remaining());
            data.copy_to_slice(&mut self.header[self.header_len..self.header_len + take]);
            self.header_len += take;
            if self.header_len < 5 {
                continue;
            }
            self.header_len = 0;
            if self.header[0] > 1 {
                return Err(Status::invalid_argument(format!(
                    "malformed gRPC message: compression flag {} is neither 0 nor 1",
                    self.header[0]
                )));
            }
            let length = u32::from_be_bytes([
                self.header[1],
                self.header[2],
                self.header[3],
                self.header[4],
            ]) as usize;
            if length > self.max_message_bytes {
                return Err(Status::resource_exhausted(format!(
                    "GetServerInfo request message of {length} bytes exceeds {} bytes \
                     (max_message_bytes)",
                    self.max_message_bytes
                )));
            }
            self.remaining = length;
        }
        Ok(())
    }

    /// The body ended: a message cut short is malformed.
    pub fn finish(&self) -> Result<(), Status> {
        if self.header_len > 0 || self.remaining > 0 {
            return Err(Status::invalid_argument(
                "malformed gRPC request: the body ends inside a message",
            ));
        }
        Ok(())
    }
}

fn ok_response(reply: Bytes) -> Response<Body> {
    let mut response = Response::new(Body::new(ReplyBody::new(reply)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// One data frame, then the `grpc-status: 0` trailers.
struct ReplyBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl ReplyBody {
    fn new(data: Bytes) -> Self {
        let mut trailers = HeaderMap::with_capacity(1);
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        Self {
            data: Some(data),
            trailers: Some(trailers),
        }
    }
}

impl http_body::Body for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(
            self.trailers
                .take()
                .map(|trailers| Ok(Frame::trailers(trailers))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}
