//! gRPC server reflection over loopback with tonic-reflection's own client: what it lists,
//! what it describes, the switch, and the cap on requests per stream.

use std::net::SocketAddr;

use prost::Message;
use prost_types::FileDescriptorProto;
use tonic::Code;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

use _native::reflection::{MAX_REQUESTS_PER_STREAM, MAX_STREAMS, REFLECTION_SERVICES};
use _native::server::{MetadataServer, ServerOptions};
use _native::{GET_SERVER_INFO_PATH, SGLANG_SERVICE};

mod common;
use common::*;

fn start(reflection: bool) -> MetadataServer {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let options = ServerOptions {
        reflection,
        ..ServerOptions::default()
    };
    MetadataServer::start(addr, r#"{"node_rank": 1}"#.to_owned(), &options).unwrap()
}

fn request(message: MessageRequest) -> ServerReflectionRequest {
    ServerReflectionRequest {
        host: String::new(),
        message_request: Some(message),
    }
}

/// Sends `requests` on one stream; the answers received and how the stream ended.
async fn reflect(
    server: &MetadataServer,
    requests: Vec<ServerReflectionRequest>,
) -> (Vec<ServerReflectionResponse>, Code) {
    let mut client = ServerReflectionClient::new(channel(server).await);
    let call = async {
        let mut replies = match client
            .server_reflection_info(tokio_stream::iter(requests))
            .await
        {
            Ok(response) => response.into_inner(),
            Err(status) => return (Vec::new(), status.code()),
        };
        let mut answers = Vec::new();
        loop {
            match replies.message().await {
                Ok(Some(answer)) => answers.push(answer),
                Ok(None) => return (answers, Code::Ok),
                Err(status) => return (answers, status.code()),
            }
        }
    };
    tokio::time::timeout(DEADLINE, call)
        .await
        .expect("a verdict")
}

fn listed(answer: &ServerReflectionResponse) -> Vec<String> {
    match &answer.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            let mut names: Vec<String> = list.service.iter().map(|s| s.name.clone()).collect();
            names.sort();
            names
        }
        other => panic!("not a service list: {other:?}"),
    }
}

#[tokio::test]
async fn lists_exactly_the_served_services_and_describes_get_server_info() {
    let server = start(true);
    let (answers, code) = reflect(
        &server,
        vec![
            request(MessageRequest::ListServices(String::new())),
            request(MessageRequest::FileContainingSymbol(
                SGLANG_SERVICE.to_owned(),
            )),
        ],
    )
    .await;
    assert_eq!(code, Code::Ok);
    let mut expected = vec![SGLANG_SERVICE, "grpc.health.v1.Health"];
    expected.extend(REFLECTION_SERVICES);
    expected.sort();
    assert_eq!(listed(&answers[0]), expected);

    let Some(MessageResponse::FileDescriptorResponse(files)) = &answers[1].message_response else {
        panic!("not a descriptor: {:?}", answers[1]);
    };
    let file = FileDescriptorProto::decode(files.file_descriptor_proto[0].as_slice()).unwrap();
    let service = &file.service[0];
    let method = &service.method[0];
    assert_eq!(
        format!("/{}.{}/{}", file.package(), service.name(), method.name()),
        GET_SERVER_INFO_PATH
    );
    assert_eq!(
        method.input_type(),
        ".sglang.runtime.v1.GetServerInfoRequest"
    );
    assert_eq!(
        method.output_type(),
        ".sglang.runtime.v1.GetServerInfoResponse"
    );
    shutdown(server).await;
}

#[tokio::test]
async fn a_stream_gets_its_first_answers_then_resource_exhausted() {
    let server = start(true);
    let requests =
        vec![request(MessageRequest::ListServices(String::new())); 3 * MAX_REQUESTS_PER_STREAM];
    let (answers, code) = reflect(&server, requests).await;
    assert_eq!(code, Code::ResourceExhausted);
    assert_eq!(answers.len(), MAX_REQUESTS_PER_STREAM);
    // The connection and the server are fine: a stream exactly at the cap is answered in full.
    let requests =
        vec![request(MessageRequest::ListServices(String::new())); MAX_REQUESTS_PER_STREAM];
    let (answers, code) = reflect(&server, requests).await;
    assert_eq!((answers.len(), code), (MAX_REQUESTS_PER_STREAM, Code::Ok));
    shutdown(server).await;
}

/// A stream that asked one question, got its answer, and stays open until dropped.
struct HeldStream {
    _requests: tokio::sync::mpsc::Sender<ServerReflectionRequest>,
    _replies: tonic::Streaming<ServerReflectionResponse>,
}

/// Opens a stream and waits for the answer to a first ListServices; the refusal if none.
async fn hold_stream(server: &MetadataServer) -> Result<HeldStream, Code> {
    let (requests, rx) = tokio::sync::mpsc::channel(1);
    requests
        .send(request(MessageRequest::ListServices(String::new())))
        .await
        .unwrap();
    let mut client = ServerReflectionClient::new(channel(server).await);
    let call = async {
        let mut replies = client
            .server_reflection_info(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(|status| status.code())?
            .into_inner();
        match replies.message().await {
            Ok(Some(_)) => Ok(replies),
            Ok(None) => Err(Code::Ok),
            Err(status) => Err(status.code()),
        }
    };
    let replies = tokio::time::timeout(DEADLINE, call)
        .await
        .expect("a verdict")?;
    Ok(HeldStream {
        _requests: requests,
        _replies: replies,
    })
}

#[tokio::test]
async fn at_most_max_streams_are_open_at_once_and_a_closed_one_frees_its_place() {
    let server = start(true);
    let mut held = Vec::new();
    for _ in 0..MAX_STREAMS {
        held.push(hold_stream(&server).await.expect("a stream within the cap"));
    }
    assert_eq!(
        hold_stream(&server).await.err(),
        Some(Code::ResourceExhausted)
    );
    // GetServerInfo and health are not affected by reflection's cap.
    let mut client =
        client::sglang_service_client::SglangServiceClient::new(channel(&server).await);
    client
        .get_server_info(client::GetServerInfoRequest {})
        .await
        .unwrap();

    held.pop();
    // The server notices the reset stream on its own time: retry until it has, or the deadline.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let again = loop {
        match hold_stream(&server).await {
            Ok(stream) => break stream,
            Err(Code::ResourceExhausted) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(code) => panic!("no place freed before the deadline: {code:?}"),
        }
    };
    drop((again, held));
    shutdown(server).await;
}

#[tokio::test]
async fn switched_off_reflection_is_unimplemented() {
    let server = start(false);
    let (answers, code) = reflect(
        &server,
        vec![request(MessageRequest::ListServices(String::new()))],
    )
    .await;
    assert!(answers.is_empty());
    assert_eq!(code, Code::Unimplemented);
    shutdown(server).await;
}
