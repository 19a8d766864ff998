//! `sglang.runtime.v1.SglangService` for a follower: GetServerInfo and nothing else.
//!
//! The snapshot never changes while the server runs, so the whole gRPC reply (length-prefixed
//! `GetServerInfoResponse`) is encoded once at start-up and every call hands out a reference
//! to the same bytes: no per-call allocation, encoding or copy, which is what dominates with
//! megabyte snapshots. Every other method answers UNIMPLEMENTED.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use prost::Message;
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
}

impl SnapshotService {
    pub fn new(json_info: String) -> Self {
        let message = GetServerInfoResponse { json_info };
        let mut frame = BytesMut::with_capacity(5 + message.encoded_len());
        frame.put_u8(0); // not compressed
        frame.put_u32(message.encoded_len() as u32);
        message
            .encode(&mut frame)
            .expect("buffer sized to the message");
        Self {
            framed_reply: frame.freeze(),
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
        Box::pin(async move {
            // Read the (empty) request to its end so the stream closes normally rather than
            // being reset under a client that is still sending.
            let _ = request.into_body().collect().await;
            Ok(ok_response(reply))
        })
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
