//! gRPC server reflection (`grpc.reflection.v1` and `v1alpha`) over exactly what this server
//! serves, so `grpcurl -plaintext HOST:PORT list` and `describe` work against a follower.
//!
//! The schema comes from descriptor sets compiled into the binary: SglangService's from the
//! proto in `proto/` (written by `build.rs`), grpc.health.v1's and the reflection services'
//! own from tonic-health and tonic-reflection. Nothing else is registered, so reflection
//! reveals the schema of the served services and nothing more.
//!
//! A reflection call is a bidirectional stream that a client may keep open and feed forever,
//! and each answer (a file descriptor of up to a few KiB) is larger than the request that asks
//! for it; tonic buffers up to 32 KiB of answers per stream before flow control stops it, and
//! hyper one more chunk. So [`ReflectionLimits`] bounds both the streams and what each may ask:
//! at most [`MAX_STREAMS`] reflection streams are open on a server at once (one more is
//! refused with RESOURCE_EXHAUSTED at once), and each carries at most
//! [`MAX_REQUESTS_PER_STREAM`] requests of at most `max_message_bytes` each. The request after
//! the last one allowed is refused with RESOURCE_EXHAUSTED (the answers to the earlier ones
//! are delivered first), and nothing of it is read.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::Frame;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;
use tower_service::Service;

use crate::frames::{Filtered, FrameFilter};
use crate::service::RequestReader;

/// The encoded `FileDescriptorSet` of `proto/sglang/runtime/v1/sglang.proto`.
pub const SGLANG_FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sglang.runtime.v1.fds"));

/// Requests one reflection stream may carry. A grpcurl command sends a few (one per symbol or
/// file it resolves); the cap only stops a client that never stops.
pub const MAX_REQUESTS_PER_STREAM: usize = 100;

/// Reflection streams open at once on one server, v1 and v1alpha together. grpcurl opens one
/// per command.
pub const MAX_STREAMS: usize = 16;

/// The reflection services' names, as they are listed next to the served ones.
pub const REFLECTION_SERVICES: [&str; 2] = [
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

fn builder() -> tonic_reflection::server::Builder<'static> {
    // Both versions list both reflection services, so either answers the same list.
    tonic_reflection::server::Builder::configure()
        .include_reflection_service(false)
        .register_encoded_file_descriptor_set(SGLANG_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
}

/// The v1 and v1alpha (what older clients ask) reflection services, bounded together.
pub fn services(
    max_message_bytes: usize,
) -> (
    ReflectionLimits<
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
    >,
    ReflectionLimits<
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    >,
) {
    let streams = Arc::new(Semaphore::new(MAX_STREAMS));
    let v1 = builder()
        .build_v1()
        .expect("the compiled-in descriptor sets are valid")
        .max_decoding_message_size(max_message_bytes);
    let v1alpha = builder()
        .build_v1alpha()
        .expect("the compiled-in descriptor sets are valid")
        .max_decoding_message_size(max_message_bytes);
    (
        ReflectionLimits::new(v1, max_message_bytes, streams.clone()),
        ReflectionLimits::new(v1alpha, max_message_bytes, streams),
    )
}

/// Admits a reflection stream only with one of the server's [`MAX_STREAMS`] permits, counts
/// its messages, and ends it with the refusal once a limit is crossed.
#[derive(Clone)]
pub struct ReflectionLimits<S> {
    inner: S,
    max_message_bytes: usize,
    streams: Arc<Semaphore>,
}

impl<S> ReflectionLimits<S> {
    fn new(inner: S, max_message_bytes: usize, streams: Arc<Semaphore>) -> Self {
        Self {
            inner,
            max_message_bytes,
            streams,
        }
    }
}

impl<S: NamedService> NamedService for ReflectionLimits<S> {
    const NAME: &'static str = S::NAME;
}

type Refused = Arc<Mutex<Option<Status>>>;

impl<S> Service<Request<Body>> for ReflectionLimits<S>
where
    S: Service<Request<CountedRequest>, Response = Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // Held by the request (which tonic-reflection's task owns) and by the reply, so the
        // stream counts until both are gone.
        let Ok(permit) = self.streams.clone().try_acquire_owned() else {
            let status = Status::resource_exhausted(format!(
                "reflection: {MAX_STREAMS} streams already open on this server"
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        };
        let permit = Arc::new(permit);
        let refused = Refused::default();
        let reader = RequestReader::messages(
            "reflection",
            MAX_REQUESTS_PER_STREAM,
            self.max_message_bytes,
        );
        let count = RequestCount {
            reader,
            pending: None,
            refused: refused.clone(),
            _permit: permit.clone(),
        };
        let request = request.map(|inner| Filtered::new(inner, count));
        let reply = self.inner.call(request);
        Box::pin(async move {
            let response = reply.await?;
            Ok(response.map(|inner| {
                Body::new(Filtered::new(
                    inner,
                    RefusableReply {
                        refused,
                        _permit: permit,
                    },
                ))
            }))
        })
    }
}

/// A reflection request body that passes messages through until a limit is crossed, then
/// ends with the refusal (which it also leaves for the reply).
pub type CountedRequest = Filtered<RequestCount>;

/// The rule of [`CountedRequest`]: count messages, refuse past the limit.
pub struct RequestCount {
    reader: RequestReader,
    /// The refusal to give on the next poll, after the accepted part of a chunk.
    pending: Option<Status>,
    refused: Refused,
    _permit: Arc<OwnedSemaphorePermit>,
}

impl RequestCount {
    fn refuse(&mut self, status: Status) -> Status {
        *self
            .refused
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = Some(status.clone());
        status
    }
}

impl FrameFilter for RequestCount {
    fn frame(&mut self, frame: Frame<Bytes>) -> Result<Frame<Bytes>, Status> {
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => return Ok(frame),
        };
        match self.reader.feed_chunk(data.clone()) {
            Ok(()) => Ok(Frame::data(data)),
            Err(refusal) if refusal.accepted > 0 => {
                self.pending = Some(refusal.status);
                Ok(Frame::data(data.slice(..refusal.accepted)))
            }
            Err(refusal) => Err(self.refuse(refusal.status)),
        }
    }

    fn held_back(&mut self) -> Option<Status> {
        let status = self.pending.take()?;
        Some(self.refuse(status))
    }

    fn holds_back(&self) -> bool {
        self.pending.is_some()
    }
}

/// The rule of the reflection reply: its final status becomes the request's refusal if there
/// was one. (tonic-reflection ends the reply normally when its request stream fails.)
struct RefusableReply {
    refused: Refused,
    _permit: Arc<OwnedSemaphorePermit>,
}

impl FrameFilter for RefusableReply {
    fn frame(&mut self, frame: Frame<Bytes>) -> Result<Frame<Bytes>, Status> {
        if !frame.is_trailers() {
            return Ok(frame);
        }
        let refused = self
            .refused
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .take();
        let Some(status) = refused else {
            return Ok(frame);
        };
        let mut trailers = HeaderMap::with_capacity(2);
        match status.add_header(&mut trailers) {
            Ok(()) => Ok(Frame::trailers(trailers)),
            Err(_) => Ok(frame),
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use prost_types::FileDescriptorSet;

    use super::*;
    use crate::GET_SERVER_INFO_PATH;

    #[test]
    fn the_descriptor_set_describes_exactly_the_served_method() {
        let set = FileDescriptorSet::decode(SGLANG_FILE_DESCRIPTOR_SET).unwrap();
        let mut paths = Vec::new();
        for file in &set.file {
            for service in &file.service {
                for method in &service.method {
                    paths.push(format!(
                        "/{}.{}/{}",
                        file.package(),
                        service.name(),
                        method.name()
                    ));
                }
            }
        }
        assert_eq!(paths, [GET_SERVER_INFO_PATH]);
    }

    #[test]
    fn a_refusal_inside_a_chunk_accepts_the_messages_before_it() {
        let mut reader = RequestReader::messages("reflection", 2, 16);
        let mut chunk = Vec::new();
        for _ in 0..3 {
            chunk.extend_from_slice(&[0, 0, 0, 0, 2, 8, 1]);
        }
        let refusal = reader.feed_chunk(Bytes::from(chunk)).unwrap_err();
        assert_eq!(refusal.accepted, 14);
        assert_eq!(refusal.status.code(), tonic::Code::ResourceExhausted);
    }

    #[test]
    fn a_message_header_split_across_chunks_is_refused_from_its_start() {
        let mut reader = RequestReader::messages("reflection", 1, 16);
        reader
            .feed_chunk(Bytes::from_static(&[0, 0, 0, 0, 1, 8, 0, 0]))
            .unwrap();
        let refusal = reader
            .feed_chunk(Bytes::from_static(&[0, 0, 1, 8]))
            .unwrap_err();
        assert_eq!(refusal.accepted, 0);
    }
}
