"""gRPC server reflection on the native follower server, seen from grpcio-reflection's client.

What ``grpcurl -plaintext HOST:PORT list`` and ``describe`` ask, over loopback against a real
server: the list of services, the descriptor of SglangService, the switch that turns reflection
off, and the cap on requests per reflection stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from sglang_sidecar_overlay import _native
from sglang_sidecar_overlay._native import MetadataServer, start_metadata_server
from sglang_sidecar_overlay.tools.probe import wire

SNAPSHOT = json.dumps({"node_rank": 1, "nnodes": 2, "kv_event_sources": []})
SERVED = {
    wire.SGLANG_SERVICE,
    wire.HEALTH_SERVICE,
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
}
TIMEOUT_S = 20.0


@pytest.fixture
def channel(server: MetadataServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as chan:
        yield chan


def reflect(
    channel: grpc.Channel, requests: list[reflection_pb2.ServerReflectionRequest]
) -> list[reflection_pb2.ServerReflectionResponse]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    return list(stub.ServerReflectionInfo(iter(requests), timeout=TIMEOUT_S))


def test_list_services_names_exactly_the_served_services(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    assert sorted(database.get_services()) == sorted(SERVED)


def test_v1_answers_the_same_list(channel: grpc.Channel) -> None:
    # grpcurl asks v1 first; grpcio-reflection's client speaks v1alpha, whose messages are the
    # same on the wire.
    call = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (reply,) = call(iter([request]), timeout=TIMEOUT_S)
    assert sorted(s.name for s in reply.list_services_response.service) == sorted(SERVED)


def test_the_service_descriptor_gives_get_server_info_and_its_types(
    channel: grpc.Channel,
) -> None:
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=wire.SGLANG_SERVICE)
    (reply,) = reflect(channel, [request])
    (raw,) = reply.file_descriptor_response.file_descriptor_proto
    file = descriptor_pb2.FileDescriptorProto.FromString(raw)
    assert f"{file.package}.{file.service[0].name}" == wire.SGLANG_SERVICE
    (method,) = file.service[0].method
    assert f"/{wire.SGLANG_SERVICE}/{method.name}" == wire.GET_SERVER_INFO_PATH
    assert method.input_type == ".sglang.runtime.v1.GetServerInfoRequest"
    assert method.output_type == ".sglang.runtime.v1.GetServerInfoResponse"
    assert not method.client_streaming and not method.server_streaming

    # What a describing client builds from it: a pool that resolves the types by name.
    pool = DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    service = pool.FindServiceByName(wire.SGLANG_SERVICE)
    described = service.methods_by_name["GetServerInfo"]
    assert described.input_type.fields == []
    assert [(f.name, f.number) for f in described.output_type.fields] == [("json_info", 1)]
    health = pool.FindServiceByName(wire.HEALTH_SERVICE)
    assert set(health.methods_by_name) == {"Check", "Watch"}


def test_an_unknown_symbol_is_not_found(channel: grpc.Channel) -> None:
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.such.Service")
    with pytest.raises(grpc.RpcError) as caught:
        reflect(channel, [request])
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_switched_off_is_unimplemented() -> None:
    with (
        start_metadata_server("127.0.0.1", 0, SNAPSHOT, reflection=False) as srv,
        grpc.insecure_channel(f"127.0.0.1:{srv.port}") as chan,
    ):
        for version in ("v1", "v1alpha"):
            call = chan.stream_stream(
                f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
            )
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            with pytest.raises(grpc.RpcError) as caught:
                list(call(iter([request]), timeout=TIMEOUT_S))
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # The served services are unaffected.
        health = chan.unary_unary(
            wire.HEALTH_CHECK_PATH,
            request_serializer=wire.encode_health_check_request,
            response_deserializer=wire.decode_health_check_response,
        )
        assert health("", timeout=TIMEOUT_S) == wire.ServingStatus.NOT_SERVING


@pytest.mark.parametrize("bad", [1, 0, "yes"])
def test_a_reflection_value_that_is_not_a_bool_raises_value_error_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^reflection=.* is invalid: expected True or False"):
        start_metadata_server("127.0.0.1", 0, SNAPSHOT, reflection=bad)


def test_a_stream_is_answered_up_to_the_cap_then_refused(
    server: MetadataServer, channel: grpc.Channel
) -> None:
    cap = _native.MAX_REFLECTION_REQUESTS
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    answered = 0
    # One request past the cap: more would be a flood of small DATA frames, which h2's own
    # flood guard may answer with GOAWAY (ENHANCE_YOUR_CALM) before the cap's refusal.
    with pytest.raises(grpc.RpcError) as caught:
        for reply in stub.ServerReflectionInfo(iter([request] * (cap + 1)), timeout=TIMEOUT_S):
            assert {s.name for s in reply.list_services_response.service} == SERVED
            answered += 1
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert answered == cap
    # A stream within the cap on the same channel is answered in full.
    assert len(reflect(channel, [request] * cap)) == cap


def test_an_oversized_reflection_request_is_refused(channel: grpc.Channel) -> None:
    symbol = "x" * (_native.DEFAULT_LIMITS["max_message_bytes"] + 1)
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)
    with pytest.raises(grpc.RpcError) as caught:
        reflect(channel, [request])
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
