"""The probe's pieces in-process: wire codecs, contract rules, real gRPC and real ZMQ.

The probe targets (``grpc_node``, ``live_publishers``, ``good_info``) come from
``probe_nodes``; ``tools/test_cli.py`` runs the same scenarios through the CLI as a subprocess.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
from collections.abc import Iterator
from unittest import mock

import msgspec
import pytest
import zmq
from probe_nodes import (
    closed_port,
    errors_of,
    feeding,
    good_info,
    grpc_node,
    live_publishers,
    publish_history,
    warnings_of,
)
from sglang_sidecar_overlay.contract.events import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    KVEventBatch,
    encode_seq,
)
from sglang_sidecar_overlay.contract.server_info import render_server_info
from sglang_sidecar_overlay.tools import probe
from sglang_sidecar_overlay.tools.probe import wire
from sglang_sidecar_overlay.tools.probe.listen import Subscriptions, traffic_findings
from sglang_sidecar_overlay.tools.probe.report import RankTraffic
from testkit.wire_server import (
    decode_health_check_request,
    encode_get_server_info_response,
    encode_health_check_response,
)

# --- wire codecs --------------------------------------------------------------------------------


def test_wire_round_trips_and_skips_unknown_fields() -> None:
    text = json.dumps({"kv_event_sources": [], "note": "ü" * 300})
    encoded = encode_get_server_info_response(text)
    assert wire.decode_get_server_info_response(encoded) == text
    # An unknown varint field 2 and fixed32 field 3 ahead of json_info are skipped.
    extra = b"\x10\x05" + b"\x1d\x00\x00\x00\x00"
    assert wire.decode_get_server_info_response(extra + encoded) == text
    assert wire.encode_get_server_info_request() == b""
    assert wire.decode_get_server_info_response(b"") == ""
    for status in wire.ServingStatus:
        raw = encode_health_check_response(status)
        assert wire.decode_health_check_response(raw) == status
    assert decode_health_check_request(wire.encode_health_check_request("svc")) == "svc"
    assert wire.status_name(9) == "UNRECOGNIZED(9)"


@pytest.mark.parametrize("raw", [b"\x0a\x05ab", b"\x0a", b"\x08\xff", b"\x0f", b"\x00\x01"])
def test_wire_rejects_malformed_bytes(raw: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.decode_get_server_info_response(raw)


# --- targets and endpoints ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("localhost:50051", ("localhost", 50051)),
        ("127.0.0.1:1", ("127.0.0.1", 1)),
        ("[::1]:50051", ("::1", 50051)),
        ("::1:50051", ("::1", 50051)),
    ],
)
def test_parse_target_accepts(text: str, expected: tuple[str, int]) -> None:
    assert probe.parse_target(text) == expected


@pytest.mark.parametrize("text", ["localhost", ":50051", "host:0", "host:70000", "[::1]50051"])
def test_parse_target_rejects(text: str) -> None:
    with pytest.raises(probe.ProbeError) as caught:
        probe.parse_target(text)
    assert caught.value.kind == "bad_target"


# --- contract rules -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample() -> Iterator[dict]:
    with live_publishers() as publishers:
        yield good_info(publishers)


def test_clean_snapshot_has_no_problem(sample: dict) -> None:
    info, findings = probe.check_server_info(json.dumps(sample))
    assert info == sample
    assert errors_of(findings) == {} and warnings_of(findings) == {}


def _broken(sample: dict, **changes: object) -> list[probe.Finding]:
    info = copy.deepcopy(sample)
    for path, value in changes.items():
        target = info
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        last = keys[-1]
        if isinstance(target, list):
            target[int(last)] = value
        elif value is KeyError:
            del target[last]
        else:
            target[last] = value
    return probe.check_server_info(json.dumps(info))[1]


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"node_rank": 2}, "node_rank", "not < nnodes"),
        ({"nnodes": 0}, "nnodes", "≥ 1"),
        ({"dist_init_addr": None}, "dist_init_addr", "must be set"),
        ({"dp_size": 0}, "dp_size", "≥ 1"),
        ({"kv_event_sources": KeyError}, "kv_event_sources", "missing"),
        ({"kv_event_sources": None}, "kv_event_sources", "must be a list"),
        ({"kv_event_rank_space": KeyError}, "kv_event_rank_space", "missing"),
        (
            {"kv_event_sources__1__dp_rank": 7, "kv_event_rank_space__local_ranks": [2, 7]},
            "kv_event_sources[1].dp_rank",
            "outside the publisher-rank space",
        ),
        ({"kv_event_sources__1__dp_rank": 2}, "kv_event_sources[1].dp_rank", "also advertised"),
        ({"kv_event_sources__1__dp_rank": -1}, "kv_event_sources[1].dp_rank", "≥ 0"),
        (
            {"kv_event_sources__1__endpoint": "tcp://*:5557"},
            "kv_event_sources[1].endpoint",
            "wildcard",
        ),
        (
            {"kv_event_sources__1__endpoint": "tcp://[1:2]:5557"},
            "kv_event_sources[1].endpoint",
            "not in advertised form",
        ),
        (
            {"kv_event_sources__0__replay_endpoint": "ipc://rel/replay"},
            "kv_event_sources[0].replay_endpoint",
            "absolute",
        ),
        ({"kv_event_sources__1__block_size": 0}, "kv_event_sources[1].block_size", "≥ 1"),
        ({"kv_event_sources__1__block_size": 32}, "kv_event_sources[1].block_size", "differs"),
        ({"kv_events__block_size": 32}, "kv_events.block_size", "differs"),
        ({"kv_event_sources__0__topic": 5}, "kv_event_sources[0].topic", "string"),
        ({"kv_event_rank_space__local_ranks": [2]}, "kv_event_rank_space.local_ranks", "match"),
        ({"kv_event_rank_space__size": 8}, "kv_event_rank_space.size", "system_dp_size"),
        ({"api_key": "hunter2"}, "api_key", "redacted"),
        ({"disaggregation_mode": "both"}, "disaggregation_mode", "unknown"),
    ],
)
def test_each_contract_rule_names_its_field(
    sample: dict, changes: dict, field: str, words: str
) -> None:
    errors = errors_of(_broken(sample, **changes))
    assert field in errors, errors
    assert words in errors[field]


def test_duplicate_endpoint_is_an_error(sample: dict) -> None:
    endpoint = sample["kv_event_sources"][0]["endpoint"]
    errors = errors_of(_broken(sample, kv_event_sources__1__endpoint=endpoint))
    assert (
        "also advertised by kv_event_sources[0].endpoint" in errors["kv_event_sources[1].endpoint"]
    )


def test_unsorted_sources_are_an_error(sample: dict) -> None:
    info = copy.deepcopy(sample)
    info["kv_event_sources"].reverse()
    errors = errors_of(probe.check_server_info(json.dumps(info))[1])
    assert "not sorted" in errors["kv_event_sources"]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", ""])
def test_unparsable_json_is_one_error(text: str) -> None:
    info, findings = probe.check_server_info(text)
    assert info is None
    assert list(errors_of(findings)) == ["json_info"]


def test_dp_size_below_the_ranks_is_no_contract_problem(sample: dict) -> None:
    # What SGLang 0.5.22+ reports for --dp 4 --enable-dp-attention: the contract holds; what a
    # consumer makes of it is the consumer rules' (test_consumers.py), not a source check.
    findings = _broken(sample, dp_size=1)
    assert errors_of(findings) == {} and warnings_of(findings) == {}


def test_stock_layout_without_rank_space_object_derives_the_space() -> None:
    # SGLang 0.5.21 shape: dp_size counts attention-DP groups, no attn_dp_size key.
    info = {
        "node_rank": 1,
        "nnodes": 2,
        "dp_size": 4,
        "enable_dp_attention": True,
        "dist_init_addr": "10.0.0.1:5000",
        "kv_event_sources": [
            {"dp_rank": 4, "endpoint": "tcp://127.0.0.1:5561", "topic": "", "block_size": 16}
        ],
    }
    errors = errors_of(probe.check_server_info(json.dumps(info))[1])
    assert "outside the publisher-rank space of size 4" in errors["kv_event_sources[0].dp_rank"]
    assert "missing" in errors["kv_event_rank_space"]


# --- real gRPC ----------------------------------------------------------------------------------


def test_fetch_and_health_against_a_grpc_server(sample: dict) -> None:
    text = render_server_info(sample)
    with grpc_node(text, health=wire.ServingStatus.SERVING) as target:
        assert probe.fetch_server_info(target, timeout=5) == text
        assert probe.read_health(target, timeout=5)["status"] == "SERVING"
    with grpc_node(text) as target:
        assert probe.read_health(target, timeout=5)["status"] == "absent"


def test_rpc_failures_are_classified() -> None:
    port = closed_port()
    with pytest.raises(probe.ProbeError) as caught:
        probe.fetch_server_info(f"127.0.0.1:{port}", timeout=5)
    assert caught.value.kind == "unreachable" and str(port) in caught.value.message
    with grpc_node(sglang=False) as target, pytest.raises(probe.ProbeError) as caught:
        probe.fetch_server_info(target, timeout=5)
    assert caught.value.kind == "not_sglang"
    with grpc_node("{}", hang=True) as target, pytest.raises(probe.ProbeError) as caught:
        probe.fetch_server_info(target, timeout=0.3)
    assert caught.value.kind == "timeout"
    for message in (caught.value.message,):
        assert "\n" not in message


def test_probe_over_ipv6_loopback(sample: dict) -> None:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    with grpc_node(render_server_info(sample), host="::1") as target:
        assert target.startswith("[::1]:")
        report = probe.run_probe(target, timeout=5)
        assert report.error is None and report.ok


# --- real ZMQ -----------------------------------------------------------------------------------


def test_listen_counts_live_and_replayed_batches_per_rank() -> None:
    with live_publishers() as publishers:
        info = good_info(publishers)
        publish_history(publishers, [1, 2])

        def enough(traffic: list[probe.RankTraffic]) -> bool:
            return all(t.replay == "complete" and t.batches >= 2 for t in traffic)

        with feeding(publishers):
            traffic = probe.listen(info["kv_event_sources"], 10, until=enough)
    assert [t.dp_rank for t in traffic] == [2, 3]
    for item in traffic:
        assert item.replay == "complete" and item.replay_batches >= 2
        assert item.batches >= 2 and item.events == item.batches
        assert item.rank_matches is True and item.bad_messages == 0
        assert item.highest_seq is not None and item.highest_seq >= 3


def test_listen_flags_a_wrong_rank_stamp() -> None:
    with live_publishers(stamp_rank=9) as publishers:
        info = good_info(publishers)
        with feeding(publishers):
            traffic = probe.listen(
                info["kv_event_sources"], 10, until=lambda ts: all(t.batches >= 2 for t in ts)
            )
    findings = traffic_findings(traffic, 10)
    errors = errors_of(findings)
    assert "stamped with rank(s) [9], advertised 3" in errors["kv_event_sources[1].dp_rank"]


def test_listen_understands_the_pre_0_5_22_replay_framing() -> None:
    # Before 0.5.22 a replay reply is (seq, payload), without the topic frame.
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    router = context.socket(zmq.ROUTER)
    stop = threading.Event()
    try:
        pub.bind("tcp://127.0.0.1:*")
        router.bind("tcp://127.0.0.1:*")
        payload = msgspec.msgpack.encode(KVEventBatch(0.0, [AllBlocksCleared()], 0))

        def serve() -> None:
            while not stop.is_set():
                if router.poll(20):
                    identity, _, _start = router.recv_multipart()
                    for seq in range(3):
                        router.send_multipart([identity, b"", encode_seq(seq), payload])
                    router.send_multipart([identity, b"", encode_seq(REPLAY_END_SEQ), b""])

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        source = {
            "dp_rank": 0,
            "endpoint": pub.getsockopt_string(zmq.LAST_ENDPOINT),
            "topic": "",
            "block_size": 16,
            "replay_endpoint": router.getsockopt_string(zmq.LAST_ENDPOINT),
        }
        (traffic,) = probe.listen([source], 10, until=lambda ts: ts[0].replay == "complete")
        stop.set()
        thread.join(5)
    finally:
        stop.set()
        pub.close(0)
        router.close(0)
        context.term()
    assert traffic.replay == "complete"
    assert traffic.replay_batches == 3 and traffic.highest_seq == 2
    assert traffic.rank_matches is True


def test_run_probe_reports_a_connect_style_endpoint(sample: dict) -> None:
    info = copy.deepcopy(sample)
    info["kv_event_sources"][1]["endpoint"] = f"tcp://127.0.0.1:{closed_port()}"
    with grpc_node(render_server_info(info), health=wire.ServingStatus.SERVING) as target:
        report = probe.run_probe(target, timeout=5)
    errors = errors_of(report.findings)
    assert "nothing accepts connections" in errors["kv_event_sources[1].endpoint"]
    assert report.exit_code() == 1


def test_listen_to_no_source_returns_at_once() -> None:
    assert probe.listen([], 30) == []


def listen_across_a_gap(missed: int, replay_buffer_steps: int) -> RankTraffic:
    """Live batches from a real PUB socket with ``missed`` sequence numbers skipped once."""
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    try:
        pub.bind("tcp://127.0.0.1:*")
        source = {
            "dp_rank": 0,
            "endpoint": pub.getsockopt_string(zmq.LAST_ENDPOINT),
            "topic": "",
            "block_size": 16,
            "replay_endpoint": None,
            "replay_buffer_steps": replay_buffer_steps,
        }
        payload = msgspec.msgpack.encode(KVEventBatch(0.0, [AllBlocksCleared()], 0))
        subscriptions = Subscriptions([source])
        try:
            (traffic,) = subscriptions.traffic
            seq = 0
            # Numbered batches until the subscription is live (a SUB joins late), then the gap.
            while traffic.batches == 0 and seq < 500:
                pub.send_multipart([b"", encode_seq(seq), payload])
                subscriptions.poll(0.02)
                seq += 1
            assert traffic.batches > 0, "the subscription never received a batch"
            seq = (traffic.highest_seq or 0) + 1 + missed
            for _ in range(100):
                if traffic.seq_gaps:
                    break
                pub.send_multipart([b"", encode_seq(seq), payload])
                subscriptions.poll(0.05)
            return traffic
        finally:
            subscriptions.close()
    finally:
        pub.close(0)
        context.term()


def test_a_live_gap_beyond_the_replay_horizon_is_a_warning_in_listen_and_watch() -> None:
    from sglang_sidecar_overlay.tools.probe.watch import NodeView, render_lines, render_table

    traffic = listen_across_a_gap(missed=9, replay_buffer_steps=3)
    assert traffic.seq_gaps == 1 and traffic.widest_gap == 9
    assert traffic.beyond_replay_horizon
    wanted = "a live gap of 9 batches exceeds the replay horizon (replay_buffer_steps 3)"
    warnings = [f for f in traffic_findings([traffic], 1.0) if f.level == "warning"]
    assert any(wanted in f.message for f in warnings), warnings
    node = NodeView("127.0.0.1:1")
    node.subscriptions = mock.Mock(traffic=[traffic])
    assert f"warning: 127.0.0.1:1 rank 0: {wanted}" in render_lines([node])
    assert f"  warning: 127.0.0.1:1 rank 0: {wanted}" in render_table([node])


def test_a_live_gap_within_the_replay_horizon_is_no_horizon_warning() -> None:
    traffic = listen_across_a_gap(missed=3, replay_buffer_steps=3)
    assert traffic.seq_gaps == 1 and traffic.widest_gap == 3
    assert not traffic.beyond_replay_horizon
    messages = [f.message for f in traffic_findings([traffic], 1.0)]
    assert not any("replay horizon" in m for m in messages), messages
