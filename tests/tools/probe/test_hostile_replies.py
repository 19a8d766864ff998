"""``probe`` against hostile servers (the endpoint grammar's property tests are
``tests/contract/test_endpoints.py``).

Hostile nodes are real grpcio servers (``test_probe.grpc_node`` and the crafted ones below) or
raw TCP listeners on loopback; the CLI runs as a subprocess, as an operator runs it. Whatever
the reply (megabytes of JSON, 10,000-deep nesting, invalid UTF-8, wrong types, a reply that
never ends), ``probe`` exits 1 or 3 with at most one line on stderr and never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from unittest import mock

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from probe_nodes import grpc_node, run_cli
from sglang_sidecar_overlay.tools import probe
from sglang_sidecar_overlay.tools.probe import check_server_info, shapes, wire
from testkit.wire_server import encode_get_server_info_response

# --- checks on arbitrary JSON -------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=25,
)
CONTRACT_KEYS = [
    "node_rank",
    "nnodes",
    "dp_size",
    "attn_dp_size",
    "enable_dp_attention",
    "dist_init_addr",
    "disaggregation_mode",
    "launch_command",
    "kv_events",
    "kv_event_sources",
    "kv_event_rank_space",
    "page_size",
    "api_key",
]
SOURCE = st.fixed_dictionaries(
    {},
    optional={
        "dp_rank": JSON_VALUES,
        "endpoint": JSON_VALUES,
        "topic": JSON_VALUES,
        "block_size": JSON_VALUES,
        "replay_endpoint": JSON_VALUES,
    },
)
WRONG_TYPED_INFO = st.fixed_dictionaries(
    {},
    optional={
        **{key: JSON_VALUES for key in CONTRACT_KEYS},
        "kv_event_sources": st.one_of(JSON_VALUES, st.lists(SOURCE, max_size=3)),
        "kv_event_rank_space": st.one_of(
            JSON_VALUES,
            st.fixed_dictionaries(
                {},
                optional={
                    "size": JSON_VALUES,
                    "local_ranks": JSON_VALUES,
                    "system_dp_size": JSON_VALUES,
                    "attn_dp_size": JSON_VALUES,
                },
            ),
        ),
    },
)


@settings(max_examples=250, deadline=None)
@given(st.one_of(WRONG_TYPED_INFO, JSON_VALUES))
def test_checks_never_raise_on_wrong_types(value: object) -> None:
    info, findings = check_server_info(json.dumps(value))
    assert findings
    if not isinstance(value, dict):
        assert info is None


@settings(max_examples=150, deadline=None)
@given(st.one_of(WRONG_TYPED_INFO, JSON_VALUES))
def test_checks_never_raise_without_the_schema(value: object) -> None:
    """jsonschema not importable: nothing is flagged by shape, and the rules still only report."""

    def no_schema() -> None:
        raise ImportError("No module named 'jsonschema'")

    with mock.patch.object(shapes, "contract_validator", no_schema):
        _, findings = check_server_info(json.dumps(value))
    said = any("cannot check shapes" in f.message for f in findings)
    assert findings and said is isinstance(value, dict), findings


def test_a_rank_space_without_widths_is_reported_without_the_schema() -> None:
    space = {"size": 2, "local_ranks": "not a list"}
    info = {"kv_event_rank_space": space, "kv_event_sources": []}

    def no_schema() -> None:
        raise ImportError("No module named 'jsonschema'")

    with mock.patch.object(shapes, "contract_validator", no_schema):
        _, findings = check_server_info(json.dumps(info))
    assert [f.level for f in findings if f.check == "schema"] == ["error"]


@pytest.mark.parametrize("depth", [65, 10_000, 100_000])
def test_deep_nesting_is_one_error_not_a_recursion(depth: int) -> None:
    info, findings = check_server_info('{"a": ' + "[" * depth + "]" * depth + "}")
    assert info is None
    assert [(f.level, f.check) for f in findings] == [("error", "json")]
    assert "nest" in findings[0].message


@pytest.mark.parametrize("started_at", [2**40, 1e300, 1.7e308])
def test_a_launch_time_past_the_calendar_is_shown_not_raised(started_at: float) -> None:
    info = {"contract_version": 2, "incarnation": {"id": "a" * 32, "started_at": started_at}}
    _, findings = check_server_info(json.dumps(info))
    shown = [f.message for f in findings if f.field == "incarnation" and f.level == "ok"]
    assert len(shown) == 1 and "not" not in shown[0]


def test_bad_values_are_shown_short_on_one_line() -> None:
    huge = "x\n" * 500_000
    info = {
        "node_rank": [huge],
        "launch_command": {"a": huge},
        "contract_version": huge,
        "incarnation": {"id": huge, "started_at": 1},
        "kv_event_sources": [{"dp_rank": 0, "endpoint": "tcp://" + huge, "topic": huge}],
        "kv_event_rank_space": {"size": 1, "local_ranks": [huge], "extra": 1},
    }
    _, findings = check_server_info(json.dumps(info))
    errors = {f.field: f.message for f in findings if f.level == "error"}
    for field in ("node_rank", "launch_command", "contract_version", "incarnation.id"):
        assert field in errors, errors
    assert "kv_event_sources[0].endpoint" in errors and "kv_event_rank_space" in errors
    for message in errors.values():
        assert "\n" not in message and len(message) < 400, message


# --- hostile servers through the CLI ------------------------------------------------------------


def assert_clean_failure(result, codes: tuple[int, ...]) -> str:
    """Exit code in ``codes``, no traceback anywhere, at most one line on stderr."""
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-2000:]
    assert result.returncode in codes, output[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) <= 1, result.stderr[-2000:]
    return lines[0] if lines else ""


@contextlib.contextmanager
def raw_grpc_node(
    reply: Callable[[threading.Event], bytes] | None = None,
    *,
    stream: Callable[[threading.Event], Iterator[bytes]] | None = None,
) -> Iterator[str]:
    """A grpcio server whose GetServerInfo answers raw bytes (``reply``) or a stream."""
    stop = threading.Event()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    if stream is not None:
        handler = grpc.unary_stream_rpc_method_handler(lambda _request, _ctx: stream(stop))
    else:
        assert reply is not None
        handler = grpc.unary_unary_rpc_method_handler(lambda _request, _ctx: reply(stop))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(wire.SGLANG_SERVICE, {"GetServerInfo": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop.set()
        server.stop(grace=None).wait(10)


@contextlib.contextmanager
def tcp_listener(send: bytes | None) -> Iterator[str]:
    """A raw TCP listener: each connection gets ``send`` repeated until closed, or silence."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    connections: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connections.append(conn)
            if send is not None:
                threading.Thread(target=flood, args=(conn,), daemon=True).start()

    def flood(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set():
                conn.sendall(send)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(10)
        listener.close()
        for conn in connections:
            conn.close()


def test_megabytes_of_json_are_read_and_checked() -> None:
    info = {"node_rank": 0, "nnodes": 1, "dp_size": 1, "padding": ["x" * 1000] * 8000}
    with grpc_node(json.dumps(info)) as target:
        result = run_cli("probe", target, "--timeout", "30", timeout=120)
    assert_clean_failure(result, (1,))
    assert "GetServerInfo answered" in result.stdout


def test_a_reply_over_the_receive_limit_is_one_line() -> None:
    big = json.dumps({"padding": "x" * (70 * 1024 * 1024)})
    with grpc_node(big) as target:
        result = run_cli("probe", target, "--timeout", "60", timeout=180)
    line = assert_clean_failure(result, (3,))
    assert line.startswith("probe: ") and "RESOURCE_EXHAUSTED" in line


@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_deep_nesting_through_the_cli(depth: int) -> None:
    text = '{"node_rank": 0, "x": ' + "[" * depth + "]" * depth + "}"
    with grpc_node(text) as target:
        human = run_cli("probe", target, "--timeout", "30", timeout=120)
        as_json = run_cli("probe", target, "--json", "--timeout", "30", timeout=120)
    assert_clean_failure(human, (1,))
    assert "nests deeper than" in human.stdout
    assert_clean_failure(as_json, (1,))
    assert json.loads(as_json.stdout)["ok"] is False


def test_invalid_utf8_is_one_line() -> None:
    raw = b"\x0a\x04\xff\xfe\xfd\xfc"  # field 1, length 4, not UTF-8
    with raw_grpc_node(lambda _stop: raw) as target:
        result = run_cli("probe", target, "--timeout", "10")
    line = assert_clean_failure(result, (3,))
    assert "not valid UTF-8" in line


def test_a_reply_that_is_not_protobuf_is_one_line() -> None:
    with raw_grpc_node(lambda _stop: b"\x0f\xff\xff\xff") as target:
        result = run_cli("probe", target, "--timeout", "10")
    line = assert_clean_failure(result, (3,))
    assert "not a GetServerInfoResponse" in line


def test_wrong_types_everywhere_are_findings() -> None:
    info = {
        "node_rank": "zero",
        "nnodes": [],
        "dp_size": {"a": 1},
        "launch_command": 5,
        "kv_events": 7,
        "kv_event_sources": [1, "two", {"dp_rank": "x", "endpoint": 3}, None],
        "kv_event_rank_space": [1],
        "api_key": {"nested": "secret"},
        "disaggregation_mode": ["x"],
    }
    with grpc_node(json.dumps(info)) as target:
        result = run_cli("probe", target, "--timeout", "10")
    assert_clean_failure(result, (1,))
    assert "FAIL" in result.stdout


def test_a_stream_that_never_ends_times_out_in_one_line() -> None:
    def forever(stop: threading.Event) -> Iterator[bytes]:
        while not stop.wait(0.05):
            yield encode_get_server_info_response('{"node_rank": 0}')

    with raw_grpc_node(stream=forever) as target:
        result = run_cli("probe", target, "--timeout", "3", timeout=60)
    line = assert_clean_failure(result, (3,))
    assert line.startswith("probe: ")


def test_a_server_that_never_answers_times_out_in_one_line() -> None:
    def never(stop: threading.Event) -> bytes:
        stop.wait(60)
        return b""

    with raw_grpc_node(never) as target:
        result = run_cli("probe", target, "--timeout", "2", timeout=60)
    line = assert_clean_failure(result, (3,))
    assert "no answer to GetServerInfo within 2s" in line


@pytest.mark.parametrize("send", [None, b"HTTP/1.1 200 OK\r\n\r\n", b"\x00\xff" * 4096])
def test_a_tcp_peer_that_is_not_grpc_is_one_line(send: bytes | None) -> None:
    with tcp_listener(send) as target:
        result = run_cli("probe", target, "--timeout", "3", timeout=60)
    line = assert_clean_failure(result, (3,))
    assert line.startswith("probe: ")


# --- random replies through a real server -------------------------------------------------------

RAW_REPLIES = st.one_of(
    st.binary(max_size=300),
    st.builds(encode_get_server_info_response, st.text(max_size=200)),
    st.builds(
        lambda value: encode_get_server_info_response(json.dumps(value)),
        st.one_of(
            WRONG_TYPED_INFO.filter(lambda info: "kv_event_sources" not in info), JSON_VALUES
        ),
    ),
)


@pytest.fixture(scope="module")
def scripted_node() -> Iterator[tuple[str, list[bytes]]]:
    """One real server for every example: GetServerInfo answers ``script[0]`` verbatim."""
    script: list[bytes] = [b""]
    with raw_grpc_node(lambda _stop: script[0]) as target:
        yield target, script


@settings(max_examples=150, deadline=None)
@given(RAW_REPLIES)
def test_run_probe_survives_any_reply(scripted_node: tuple[str, list[bytes]], raw: bytes) -> None:
    # No kv_event_sources in the JSON replies: the probe would dial their endpoints.
    target, script = scripted_node
    script[0] = raw
    report = probe.run_probe(target, timeout=5)
    assert report.exit_code() in (1, 3)
    if report.error is not None:
        assert "\n" not in report.error.message
