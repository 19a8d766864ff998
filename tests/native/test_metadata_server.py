"""The native follower metadata server seen from a real grpcio client over loopback."""

from __future__ import annotations

import errno
import json
import socket
import threading

import grpc
import pytest
from conftest import TESTS, has_ipv6_loopback
from sglang_sidecar_overlay._native import MetadataServer, start_metadata_server
from sglang_sidecar_overlay.tools.probe import wire

UPSTREAM_RPCS = [
    line
    for line in (TESTS / "data" / "upstream_sglang_rpcs.txt").read_text().splitlines()
    if line and not line.startswith("#")
]
SNAPSHOT = json.dumps({"node_rank": 1, "nnodes": 2, "kv_event_sources": []})


def target(srv: MetadataServer) -> str:
    host = f"[{srv.host}]" if ":" in srv.host else srv.host
    return f"{host}:{srv.port}"


def get_server_info(address: str, timeout: float = 5.0) -> str:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            wire.GET_SERVER_INFO_PATH,
            request_serializer=lambda _: wire.encode_get_server_info_request(),
            response_deserializer=wire.decode_get_server_info_response,
        )
        return call(None, timeout=timeout)


def health_check(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            wire.HEALTH_CHECK_PATH,
            request_serializer=wire.encode_health_check_request,
            response_deserializer=wire.decode_health_check_response,
        )
        return call(service, timeout=5.0)


def test_get_server_info_returns_the_snapshot(server: MetadataServer) -> None:
    assert get_server_info(target(server)) == SNAPSHOT


@pytest.mark.parametrize(
    "snapshot",
    [
        json.dumps({"blob": "x" * (1 << 20)}),
        json.dumps({"name": "nœud-ü", "emoji": "🚀", "cjk": "节点"}, ensure_ascii=False),
    ],
    ids=["1MiB", "non-ascii"],
)
def test_large_and_non_ascii_snapshots_are_returned_unchanged(snapshot: str) -> None:
    with start_metadata_server("127.0.0.1", 0, snapshot) as srv:
        assert get_server_info(target(srv)) == snapshot


@pytest.mark.parametrize("method", [m for m in UPSTREAM_RPCS if m != "GetServerInfo"])
def test_every_other_upstream_method_is_unimplemented(server: MetadataServer, method: str) -> None:
    with grpc.insecure_channel(target(server)) as channel:
        call = channel.unary_unary(f"/{wire.SGLANG_SERVICE}/{method}")
        with pytest.raises(grpc.RpcError) as caught:
            call(b"", timeout=5.0)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_unknown_service_is_unimplemented(server: MetadataServer) -> None:
    with grpc.insecure_channel(target(server)) as channel:
        call = channel.unary_unary("/grpc.channelz.v1.Channelz/GetTopChannels")
        with pytest.raises(grpc.RpcError) as caught:
            call(b"", timeout=5.0)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_health_is_not_serving_until_set_and_follows_set_serving(server: MetadataServer) -> None:
    for service in ("", wire.SGLANG_SERVICE):
        assert health_check(target(server), service) == wire.ServingStatus.NOT_SERVING
    server.set_serving(True)
    for service in ("", wire.SGLANG_SERVICE):
        assert health_check(target(server), service) == wire.ServingStatus.SERVING
    server.set_serving(False)
    assert health_check(target(server)) == wire.ServingStatus.NOT_SERVING


def test_health_watch_streams_each_transition(server: MetadataServer) -> None:
    with grpc.insecure_channel(target(server)) as channel:
        watch = channel.unary_stream(
            wire.HEALTH_WATCH_PATH,
            request_serializer=wire.encode_health_check_request,
            response_deserializer=wire.decode_health_check_response,
        )
        stream = watch(wire.SGLANG_SERVICE, timeout=10.0)
        assert next(stream) == wire.ServingStatus.NOT_SERVING
        server.set_serving(True)
        assert next(stream) == wire.ServingStatus.SERVING
        server.set_serving(False)
        assert next(stream) == wire.ServingStatus.NOT_SERVING
        stream.cancel()


def test_port_zero_reports_the_bound_port(server: MetadataServer) -> None:
    assert server.port > 0
    assert server.host == "127.0.0.1"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5):
        pass


IPV6 = pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback on this machine")


@pytest.mark.parametrize(
    ("host", "bound_host", "dial_host"),
    [
        ("localhost", "127.0.0.1", "127.0.0.1"),
        ("127.0.0.1", "127.0.0.1", "127.0.0.1"),
        ("0.0.0.0", "0.0.0.0", "127.0.0.1"),
        pytest.param("::1", "::1", "[::1]", marks=IPV6),
        pytest.param("[::1]", "::1", "[::1]", marks=IPV6),
        pytest.param("::", "::", "[::1]", marks=IPV6),
    ],
)
def test_every_host_form_binds_and_answers(host: str, bound_host: str, dial_host: str) -> None:
    with start_metadata_server(host, 0, SNAPSHOT) as srv:
        assert srv.host == bound_host
        assert get_server_info(f"{dial_host}:{srv.port}") == SNAPSHOT


def test_shutdown_is_idempotent_and_safe_from_other_threads(server: MetadataServer) -> None:
    address = target(server)
    threads = [threading.Thread(target=server.shutdown) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)
    assert not server.is_alive()
    server.shutdown()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1])), timeout=5)


def test_context_manager_shuts_down_on_exit() -> None:
    with start_metadata_server("127.0.0.1", 0, SNAPSHOT) as srv:
        assert srv.is_alive()
    assert not srv.is_alive()


def test_dropping_the_last_reference_stops_the_server() -> None:
    srv = start_metadata_server("127.0.0.1", 0, SNAPSHOT)
    port = srv.port
    del srv
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_busy_port_raises_oserror_with_errno_and_address(server: MetadataServer) -> None:
    with pytest.raises(OSError) as caught:
        start_metadata_server("127.0.0.1", server.port, SNAPSHOT)
    assert caught.value.errno == errno.EADDRINUSE
    assert f"127.0.0.1:{server.port}" in str(caught.value)
    assert server.is_alive()


@pytest.mark.parametrize("bad", ["not json", "[1, 2]", '{"a": ', ""])
def test_invalid_json_raises_value_error(bad: str) -> None:
    with pytest.raises(ValueError, match="not a JSON object"):
        start_metadata_server("127.0.0.1", 0, bad)


@pytest.mark.parametrize("host", ["node-1.example", "127.0.0.300", "[::1"])
def test_a_host_that_is_not_an_address_raises_value_error_naming_it(host: str) -> None:
    with pytest.raises(ValueError, match=host.replace("[", r"\[")):
        start_metadata_server(host, 0, SNAPSHOT)


@pytest.mark.parametrize("port", [-1, 70000])
def test_a_port_out_of_range_raises_value_error_naming_it(port: int) -> None:
    with pytest.raises(ValueError, match=str(port)):
        start_metadata_server("127.0.0.1", port, SNAPSHOT)
