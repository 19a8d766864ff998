"""contract.sources against real ZMQ sockets: bind, describe, subscribe and replay through the
result.

Publishers here speak SGLang's wire format: three frames (topic, 8-byte big-endian sequence,
msgpack event batch) on PUB; replay over a bound ROUTER answers a DEALER's 8-byte start
sequence with ``[topic, seq, payload]`` batches and an end marker of sequence -1.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
import pytest
import zmq
from conftest import has_ipv6_loopback
from hypothesis import given
from hypothesis import strategies as st
from sglang_sidecar_overlay.contract.events import (
    REPLAY_END_SEQ,
    BlockStored,
    KVEventBatch,
    decode_seq,
    encode_seq,
)
from sglang_sidecar_overlay.contract.schema import load_schema
from sglang_sidecar_overlay.contract.sources import (
    KvEventSource,
    SourceConflictError,
    aggregate_sources,
    describe_source,
    normalize_endpoint,
)

DEADLINE = 10.0
POLL_MS = 50


# --- SGLang's event wire format (contract.events) ---------------------------------------------


def encode_batch(dp_rank: int, block_hash: int) -> bytes:
    event = BlockStored([block_hash], None, list(range(16)), 16, None)
    return msgspec.msgpack.encode(KVEventBatch(time.time(), [event], dp_rank))


def decode_batch(payload: bytes) -> KVEventBatch:
    return msgspec.msgpack.decode(payload, type=KVEventBatch)


def publish_until_received(pub: zmq.Socket, sub: zmq.Socket, topic: str, dp_rank: int) -> list:
    """Publish until the subscriber sees a message (PUB drops until SUB has joined)."""
    deadline = time.monotonic() + DEADLINE
    seq = 0
    while time.monotonic() < deadline:
        pub.send_multipart([topic.encode(), encode_seq(seq), encode_batch(dp_rank, seq)])
        seq += 1
        if sub.poll(POLL_MS):
            return sub.recv_multipart()
    raise AssertionError("no event reached the advertised endpoint before the deadline")


def subscribe(zmq_socket, endpoint: str, topic: str) -> zmq.Socket:
    sub = zmq_socket(zmq.SUB)
    sub.setsockopt(zmq.IPV6, 1)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(endpoint)
    return sub


def assert_received_in_wire_format(frames: list, topic: str, dp_rank: int) -> None:
    assert len(frames) == 3
    topic_frame, seq_frame, payload = frames
    assert topic_frame == topic.encode()
    assert len(seq_frame) == 8
    seq = decode_seq(seq_frame)
    assert seq is not None and seq >= 0
    batch = decode_batch(payload)
    assert batch.dp_rank == dp_rank
    assert isinstance(batch.events[0], BlockStored)


# --- live PUB subscription through the advertised endpoint -------------------------------------


def _bind_pub(zmq_socket, endpoint: str, ipv6: bool = False) -> tuple[zmq.Socket, str]:
    pub = zmq_socket(zmq.PUB)
    # Only where asked: with IPV6 on, "*" binds dual-stack and reads back as "[::]".
    pub.setsockopt(zmq.IPV6, int(ipv6 or "[" in endpoint))
    pub.bind(endpoint)
    return pub, pub.getsockopt_string(zmq.LAST_ENDPOINT)


ipv6_only = pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback on this machine")


@pytest.mark.parametrize(
    ("bind", "host"),
    [
        ("tcp://*:0", "127.0.0.1"),
        ("tcp://0.0.0.0:0", "127.0.0.1"),
        ("tcp://127.0.0.1:0", "127.0.0.1"),
        pytest.param("tcp://[::]:0", "[::1]", marks=ipv6_only),
        pytest.param("tcp://[::1]:0", "[::1]", marks=ipv6_only),
    ],
)
def test_tcp_bind_forms_are_advertised_and_subscribable(zmq_socket, bind, host):
    pub, bound = _bind_pub(zmq_socket, bind)
    source = describe_source(3, bound, "kv", 64)

    port = int(bound.rsplit(":", 1)[1])
    assert source == {
        "dp_rank": 3,
        "endpoint": f"tcp://{host}:{port}",
        "topic": "kv",
        "block_size": 64,
        "encoding": "msgpack",
    }
    sub = subscribe(zmq_socket, source["endpoint"], source["topic"])
    assert_received_in_wire_format(publish_until_received(pub, sub, "kv", 3), "kv", 3)


@ipv6_only
def test_dual_stack_wildcard_reads_back_as_ipv6_and_is_advertised_as_ipv6_loopback(zmq_socket):
    pub, bound = _bind_pub(zmq_socket, "tcp://*:0", ipv6=True)
    source = describe_source(0, bound, "", 16)

    assert bound.startswith("tcp://[::]:")
    assert source["endpoint"].startswith("tcp://[::1]:")
    sub = subscribe(zmq_socket, source["endpoint"], "")
    assert_received_in_wire_format(publish_until_received(pub, sub, "", 0), "", 0)


def test_relative_ipc_path_is_advertised_absolute(zmq_socket, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pub, bound = _bind_pub(zmq_socket, "ipc://pub.sock")
    source = describe_source(0, bound, "", 16)

    assert source["endpoint"] == f"ipc://{tmp_path / 'pub.sock'}"
    # A local consumer runs elsewhere: the advertised path must not depend on our cwd.
    monkeypatch.chdir(os.path.dirname(tmp_path))
    sub = subscribe(zmq_socket, source["endpoint"], "")
    assert_received_in_wire_format(publish_until_received(pub, sub, "", 0), "", 0)


def test_abstract_ipc_name_is_kept(zmq_socket):
    name = f"@sso-test-{uuid.uuid4().hex}"
    pub, bound = _bind_pub(zmq_socket, f"ipc://{name}")
    source = describe_source(1, bound, "t", 16)

    assert source["endpoint"] == f"ipc://{name}"
    sub = subscribe(zmq_socket, source["endpoint"], "t")
    assert_received_in_wire_format(publish_until_received(pub, sub, "t", 1), "t", 1)


def test_inproc_publisher_is_not_advertised(zmq_socket):
    _, bound = _bind_pub(zmq_socket, f"inproc://kv-{uuid.uuid4().hex}")
    assert bound.startswith("inproc://")
    assert describe_source(0, bound, "", 16) is None


def test_connect_style_publisher_is_not_advertised(zmq_socket):
    collector = zmq_socket(zmq.SUB)
    collector.bind("tcp://127.0.0.1:0")
    pub = zmq_socket(zmq.PUB)
    pub.connect(collector.getsockopt_string(zmq.LAST_ENDPOINT))
    # A connecting publisher has nothing bound: its caller passes no bound endpoint.
    assert describe_source(0, None, "", 16) is None


# --- replay through a bound ROUTER --------------------------------------------------------------


class ReplayResponder:
    """A ROUTER that answers replay requests the way SGLang's publisher does (0.5.22 framing).

    The socket lives entirely in the responder thread; ZMQ sockets are not thread-safe.
    """

    def __init__(self, context: zmq.Context, bind: str, topic: str, dp_rank: int, count: int):
        self._context = context
        self._bind = bind
        self._topic = topic.encode()
        self._buffer = [(seq, encode_batch(dp_rank, seq)) for seq in range(count)]
        self._stop = threading.Event()
        self._bound: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="replay-responder", daemon=True)

    def start(self) -> str:
        self._thread.start()
        bound = self._bound.get(timeout=DEADLINE)
        if isinstance(bound, BaseException):
            raise bound
        return bound

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=DEADLINE)
        assert not self._thread.is_alive()

    def _run(self) -> None:
        router = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.IPV6, int("[" in self._bind))
        try:
            router.bind(self._bind)
        except zmq.ZMQError as exc:
            self._bound.put(exc)
            router.close()
            return
        self._bound.put(router.getsockopt_string(zmq.LAST_ENDPOINT))
        try:
            while not self._stop.is_set():
                if router.poll(POLL_MS):
                    self._answer(router, router.recv_multipart())
        finally:
            router.close()

    def _answer(self, router: zmq.Socket, frames: list) -> None:
        identity, _, start = frames
        first = decode_seq(start)
        for seq, payload in self._buffer:
            if seq >= first:
                router.send_multipart([identity, b"", self._topic, encode_seq(seq), payload])
        router.send_multipart([identity, b"", b"", encode_seq(REPLAY_END_SEQ), b""])


@contextmanager
def replay_responder(context, bind, topic, dp_rank, count) -> Iterator[str]:
    responder = ReplayResponder(context, bind, topic, dp_rank, count)
    bound = responder.start()
    try:
        yield bound
    finally:
        responder.stop()


def request_replay(context: zmq.Context, endpoint: str, start: int) -> list[tuple[int, bytes]]:
    """Replay from ``start`` through ``endpoint``: every (seq, payload) up to the end marker."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IPV6, 1)
    try:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", encode_seq(start)])
        received = []
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            if not dealer.poll(POLL_MS):
                continue
            _, _topic, seq, payload = dealer.recv_multipart()
            if decode_seq(seq) == REPLAY_END_SEQ:
                return received
            received.append((decode_seq(seq), payload))
        raise AssertionError("replay did not end before the deadline")
    finally:
        dealer.close()


@pytest.mark.parametrize("bind", ["tcp://*:0", "tcp://0.0.0.0:0", "ipc://replay.sock"])
def test_replay_through_advertised_router(zmq_context, zmq_socket, tmp_path, monkeypatch, bind):
    monkeypatch.chdir(tmp_path)
    _, pub_bound = _bind_pub(zmq_socket, "tcp://*:0")
    with replay_responder(zmq_context, bind, "kv", 2, count=10) as replay_bound:
        source = describe_source(2, pub_bound, "kv", 32, replay_endpoint=replay_bound)
        assert normalize_endpoint(source["replay_endpoint"]) == source["replay_endpoint"]
        assert "0.0.0.0" not in source["replay_endpoint"]
        monkeypatch.chdir(os.path.dirname(tmp_path))

        batches = request_replay(zmq_context, source["replay_endpoint"], start=4)

    assert [seq for seq, _ in batches] == list(range(4, 10))
    assert {decode_batch(payload).dp_rank for _, payload in batches} == {2}


def test_unadvertisable_replay_endpoint_is_omitted():
    source = describe_source(0, "tcp://*:5557", "", 16, replay_endpoint="inproc://replay")
    assert "replay_endpoint" not in source


# --- argument checks ----------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [-1, True, 1.0, "0"])
def test_bad_rank_is_refused_by_value(rank):
    with pytest.raises(ValueError, match=repr(rank).replace(".", r"\.")):
        describe_source(rank, "tcp://*:5557", "", 16)


@pytest.mark.parametrize("block_size", [0, -16, True, 16.0, None])
def test_bad_block_size_is_refused_by_value(block_size):
    with pytest.raises(ValueError, match=repr(block_size).replace(".", r"\.")):
        describe_source(0, "tcp://*:5557", "", block_size)


# --- aggregation --------------------------------------------------------------------------------


def _source(rank: int, port: int, replay_port: int | None = None) -> dict:
    source = {
        "dp_rank": rank,
        "endpoint": f"tcp://127.0.0.1:{port}",
        "topic": "",
        "block_size": 16,
        "encoding": "msgpack",
    }
    if replay_port is not None:
        source["replay_endpoint"] = f"tcp://127.0.0.1:{replay_port}"
    return source


def test_kv_event_source_type_has_the_schemas_keys():
    definition = load_schema()["$defs"]["kv_event_source"]
    assert set(KvEventSource.__annotations__) == set(definition["properties"])
    assert KvEventSource.__required_keys__ == set(definition["required"])
    # Every served entry has exactly the type's keys, the optional ones where reported.
    bounds = {"replay_buffer_steps": 1, "hwm": 0, "max_queue_size": 2}
    full = describe_source(0, "tcp://*:6000", "", 16, "tcp://*:6001", bounds=bounds)
    assert full is not None and list(full) == list(KvEventSource.__annotations__)


def test_aggregate_sorts_and_drops_exact_duplicates():
    a, b = _source(1, 6001), _source(0, 6000)
    assert aggregate_sources([a, b, dict(a)]) == [b, a]
    assert aggregate_sources([]) == []


def test_aggregate_same_rank_different_endpoint_names_both_entries():
    with pytest.raises(SourceConflictError) as caught:
        aggregate_sources([_source(0, 6000), _source(0, 6001)])
    assert "6000" in str(caught.value) and "6001" in str(caught.value)


def test_aggregate_same_endpoint_different_rank_names_both_entries():
    with pytest.raises(SourceConflictError) as caught:
        aggregate_sources([_source(0, 6000), _source(1, 6000)])
    assert "'dp_rank': 0" in str(caught.value) and "'dp_rank': 1" in str(caught.value)


def test_aggregate_shared_replay_endpoint_is_a_conflict():
    with pytest.raises(SourceConflictError):
        aggregate_sources([_source(0, 6000, 7000), _source(1, 6001, 7000)])
    with pytest.raises(SourceConflictError):
        aggregate_sources([_source(0, 6000, 6001), _source(1, 6001)])


def test_aggregate_same_rank_different_block_size_is_a_conflict():
    other = {**_source(0, 6000), "block_size": 32}
    with pytest.raises(SourceConflictError):
        aggregate_sources([_source(0, 6000), other])


@pytest.mark.parametrize(
    "entry",
    [
        {"dp_rank": 0, "endpoint": "tcp://*:6000", "topic": "", "block_size": 16},
        {"dp_rank": 0, "endpoint": "ipc://rel.sock", "topic": "", "block_size": 16},
        {"dp_rank": 0, "endpoint": "tcp://127.0.0.1:6000", "topic": ""},
        {"dp_rank": 0, "endpoint": "tcp://127.0.0.1:6000", "topic": "", "block_size": 0},
        {"dp_rank": 0, "endpoint": "tcp://127.0.0.1:6000", "topic": "", "block_size": 16, "x": 1},
    ],
)
def test_aggregate_refuses_malformed_entries(entry):
    with pytest.raises(ValueError) as caught:
        aggregate_sources([entry])
    assert not isinstance(caught.value, SourceConflictError)


# --- properties ---------------------------------------------------------------------------------


@st.composite
def consistent_sources(draw) -> list[dict]:
    ranks = draw(st.lists(st.integers(0, 63), unique=True, max_size=8))
    ports = draw(st.lists(st.integers(1, 30000), unique=True, min_size=2 * len(ranks)))
    with_replay = draw(st.lists(st.booleans(), min_size=len(ranks), max_size=len(ranks)))
    return [
        _source(rank, ports[2 * i], ports[2 * i + 1] if with_replay[i] else None)
        for i, rank in enumerate(ranks)
    ]


@given(consistent_sources(), st.randoms(use_true_random=False))
def test_aggregate_is_order_independent_and_idempotent(sources, rng):
    expected = sorted(sources, key=lambda source: source["dp_rank"])
    shuffled = [dict(source) for source in sources + sources]
    rng.shuffle(shuffled)
    assert aggregate_sources(shuffled) == expected
    assert aggregate_sources(aggregate_sources(shuffled)) == expected


@given(consistent_sources(), st.data())
def test_aggregate_always_catches_conflicts(sources, data):
    victim = data.draw(st.sampled_from(sources)) if sources else _source(0, 40000)
    if not sources:
        sources = [victim]
    kind = data.draw(st.sampled_from(["rank", "endpoint", "replay"]))
    free_rank = max(source["dp_rank"] for source in sources) + 1
    if kind == "rank":
        conflict = {**victim, "endpoint": "tcp://127.0.0.1:40001"}
    elif kind == "endpoint":
        conflict = {**victim, "dp_rank": free_rank}
        conflict.pop("replay_endpoint", None)
    else:
        conflict = _source(free_rank, 40002)
        conflict["replay_endpoint"] = victim["endpoint"]
    entries = [*sources, conflict]
    order = data.draw(st.permutations(entries))
    with pytest.raises(SourceConflictError):
        aggregate_sources(order)
