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
//!
//! The second half of the module is the same service through tonic's generated server
//! ([`Implementation::Generated`]); the benchmark's row 6 compares the two, and
//! docs/architecture.md records why the hand-framed one is the default.

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

use crate::frames::{Filtered, FrameFilter};
use crate::proto::{GetServerInfoRequest, GetServerInfoResponse};
use crate::{GET_SERVER_INFO_PATH, SGLANG_SERVICE};

/// Which implementation of SglangService serves the snapshot. Both give the same answers;
/// they differ in what each call costs (see docs/architecture.md, "The GetServerInfo reply").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Implementation {
    /// The raw tower service below: the whole gRPC reply framed once, no copy per call.
    #[default]
    Framed,
    /// tonic's generated server returning [`EncodedReply`]: one copy of the message per call.
    Generated,
}

impl Implementation {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "framed" => Some(Self::Framed),
            "generated" => Some(Self::Generated),
            _ => None,
        }
    }
}

fn encode_reply(json_info: String) -> Bytes {
    let message = GetServerInfoResponse { json_info };
    let mut buf = BytesMut::with_capacity(message.encoded_len());
    message
        .encode(&mut buf)
        .expect("buffer sized to the message");
    buf.freeze()
}

/// Serves one immutable server-info snapshot.
#[derive(Clone)]
pub struct SnapshotService {
    framed_reply: Bytes,
    max_request_bytes: usize,
    max_message_bytes: usize,
}

impl SnapshotService {
    pub fn new(json_info: String, max_request_bytes: usize, max_message_bytes: usize) -> Self {
        let message = encode_reply(json_info);
        let mut frame = BytesMut::with_capacity(5 + message.len());
        frame.put_u8(0); // not compressed
        frame.put_u32(message.len() as u32);
        frame.put(message);
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
        if request.uri().path() != GET_SERVER_INFO_PATH {
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
    /// The call, as the refusals name it ("GetServerInfo", "reflection").
    call: &'static str,
    max_request_bytes: usize,
    max_message_bytes: usize,
    max_messages: usize,
    seen: usize,
    messages: usize,
    header: [u8; 5],
    header_len: usize,
    /// Bytes of the current message body still to skip.
    remaining: usize,
}

/// A limit crossed inside one chunk of a request body: the first `accepted` bytes of the chunk
/// belong to messages within the limits, the rest is refused with `status`.
#[derive(Debug)]
pub struct Refusal {
    pub accepted: usize,
    pub status: Status,
}

impl RequestReader {
    /// The GetServerInfo request: any number of messages within the byte limits.
    pub fn new(max_request_bytes: usize, max_message_bytes: usize) -> Self {
        Self {
            call: "GetServerInfo",
            max_request_bytes,
            max_message_bytes,
            max_messages: usize::MAX,
            seen: 0,
            messages: 0,
            header: [0; 5],
            header_len: 0,
            remaining: 0,
        }
    }

    /// A streamed request of at most `max_messages` messages of `max_message_bytes` each.
    pub fn messages(call: &'static str, max_messages: usize, max_message_bytes: usize) -> Self {
        Self {
            call,
            max_messages,
            ..Self::new(usize::MAX, max_message_bytes)
        }
    }

    pub fn feed(&mut self, data: Bytes) -> Result<(), Status> {
        self.feed_chunk(data).map_err(|refusal| refusal.status)
    }

    /// Like [`RequestReader::feed`], and on a refusal says how much of `data` came before the
    /// refused message (a message cut by a byte limit is not accepted in part: 0).
    pub fn feed_chunk(&mut self, mut data: Bytes) -> Result<(), Refusal> {
        let call = self.call;
        self.seen = self.seen.saturating_add(data.len());
        if self.seen > self.max_request_bytes {
            return Err(Refusal {
                accepted: 0,
                status: Status::resource_exhausted(format!(
                    "{call} request body exceeds {} bytes (max_request_bytes)",
                    self.max_request_bytes
                )),
            });
        }
        let chunk_len = data.len();
        while data.has_remaining() {
            if self.remaining > 0 {
                let skip = self.remaining.min(data.remaining());
                data.advance(skip);
                self.remaining -= skip;
                continue;
            }
            // Where the next message starts in this chunk (0 if its header began earlier).
            let message_start = (chunk_len - data.remaining()).saturating_sub(self.header_len);
            let take = (5 - self.header_len).min(data.remaining());
            data.copy_to_slice(&mut self.header[self.header_len..self.header_len + take]);
            self.header_len += take;
            if self.header_len < 5 {
                continue;
            }
            self.header_len = 0;
            let refuse = |status| Refusal {
                accepted: message_start,
                status,
            };
            if self.header[0] > 1 {
                return Err(refuse(Status::invalid_argument(format!(
                    "malformed gRPC message: compression flag {} is neither 0 nor 1",
                    self.header[0]
                ))));
            }
            self.messages += 1;
            if self.messages > self.max_messages {
                return Err(refuse(Status::resource_exhausted(format!(
                    "{call} stream exceeds {} requests",
                    self.max_messages
                ))));
            }
            let length = u32::from_be_bytes([
                self.header[1],
                self.header[2],
                self.header[3],
                self.header[4],
            ]) as usize;
            if length > self.max_message_bytes {
                return Err(refuse(Status::resource_exhausted(format!(
                    "{call} request message of {length} bytes exceeds {} bytes \
                     (max_message_bytes)",
                    self.max_message_bytes
                ))));
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

// --- the tonic-generated variant ----------------------------------------------------------

/// The encoded `GetServerInfoResponse` (without the 5-byte gRPC prefix), shared by every call.
#[derive(Debug, Clone)]
pub struct EncodedReply(pub Bytes);

/// Decodes the request with prost and writes the pre-encoded reply as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplyCodec;

impl tonic::codec::Codec for ReplyCodec {
    type Encode = EncodedReply;
    type Decode = GetServerInfoRequest;
    type Encoder = Self;
    type Decoder = Self;

    fn encoder(&mut self) -> Self {
        *self
    }

    fn decoder(&mut self) -> Self {
        *self
    }
}

impl tonic::codec::Encoder for ReplyCodec {
    type Item = EncodedReply;
    type Error = Status;

    fn encode(
        &mut self,
        item: EncodedReply,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), Status> {
        dst.put(item.0);
        Ok(())
    }
}

impl tonic::codec::Decoder for ReplyCodec {
    type Item = GetServerInfoRequest;
    type Error = Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<GetServerInfoRequest>, Status> {
        GetServerInfoRequest::decode(src)
            .map(Some)
            .map_err(|err| Status::invalid_argument(format!("malformed request: {err}")))
    }
}

/// The generated trait's implementation: hands out the same bytes to every call.
pub struct GeneratedSnapshot {
    reply: Bytes,
}

#[tonic::async_trait]
impl crate::generated::sglang_service_server::SglangService for GeneratedSnapshot {
    async fn get_server_info(
        &self,
        _request: tonic::Request<GetServerInfoRequest>,
    ) -> Result<tonic::Response<EncodedReply>, Status> {
        Ok(tonic::Response::new(EncodedReply(self.reply.clone())))
    }
}

/// The generated server, its requests capped at `max_request_bytes` in total (tonic's unary
/// path reads a request body to its end) and each message at `max_message_bytes`.
pub fn generated_service(
    json_info: String,
    max_request_bytes: usize,
    max_message_bytes: usize,
) -> CappedRequests<crate::generated::sglang_service_server::SglangServiceServer<GeneratedSnapshot>>
{
    let server =
        crate::generated::sglang_service_server::SglangServiceServer::new(GeneratedSnapshot {
            reply: encode_reply(json_info),
        })
        .max_decoding_message_size(max_message_bytes);
    CappedRequests {
        inner: server,
        limit: max_request_bytes,
    }
}

/// Wraps every request body in a [`CappedBody`].
#[derive(Clone)]
pub struct CappedRequests<S> {
    inner: S,
    limit: usize,
}

impl<S: NamedService> NamedService for CappedRequests<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<Request<Body>> for CappedRequests<S>
where
    S: Service<Request<CappedBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> S::Future {
        let limit = self.limit;
        self.inner
            .call(request.map(|inner| Filtered::new(inner, ByteCap { seen: 0, limit })))
    }
}

/// A request body that fails with RESOURCE_EXHAUSTED once more than `limit` bytes arrived.
pub type CappedBody = Filtered<ByteCap>;

/// The rule of [`CappedBody`]: count data bytes, refuse past `limit`.
pub struct ByteCap {
    seen: usize,
    limit: usize,
}

impl FrameFilter for ByteCap {
    fn frame(&mut self, frame: Frame<Bytes>) -> Result<Frame<Bytes>, Status> {
        if let Some(data) = frame.data_ref() {
            self.seen = self.seen.saturating_add(data.len());
            if self.seen > self.limit {
                return Err(Status::resource_exhausted(format!(
                    "GetServerInfo request body exceeds {} bytes (max_request_bytes)",
                    self.limit
                )));
            }
        }
        Ok(frame)
    }
}
