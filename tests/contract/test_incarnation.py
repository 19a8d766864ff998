"""The restart-aware contract: ``contract_version``, ``incarnation``, per-source ``encoding`` and
(contract 3) each source's replay horizon and queue bounds, from the builder through the schema
to what ``probe`` says about them."""

from __future__ import annotations

import collections
import copy
import json
import queue
import re
import types

import jsonschema
import pytest
from probe_nodes import errors_of
from sglang_sidecar_overlay.adapters._publisher import publisher_bounds
from sglang_sidecar_overlay.adapters._server_info import with_publisher_bounds
from sglang_sidecar_overlay.contract.incarnation import (
    CONTRACT_VERSION,
    Incarnation,
    check_incarnation,
)
from sglang_sidecar_overlay.contract.schema import load_schema
from sglang_sidecar_overlay.contract.server_info import build_server_info, render_server_info
from sglang_sidecar_overlay.contract.sources import (
    DEFAULT_ENCODING,
    SOURCE_BOUNDS,
    aggregate_sources,
    describe_source,
)
from sglang_sidecar_overlay.tools import probe
from sglang_sidecar_overlay.tools.probe.checks import check_server_info, describe_incarnation

ARGS = {"node_rank": 1, "nnodes": 2, "dist_init_addr": "10.0.0.1:5000", "dp_size": 2}
READY = {"status": "ready"}
FIXED = Incarnation(id="fedcba9876543210" * 2, started_at=1_800_000_000.5)


def snapshot(incarnation=FIXED, args=ARGS) -> dict:
    sources = [describe_source(1, "tcp://*:5558", "kv", 16, "tcp://*:5601")]
    return build_server_info(args, READY, incarnation=incarnation, kv_event_sources=sources)


def test_every_incarnation_gets_a_new_128_bit_id_and_its_start_time() -> None:
    first = Incarnation.new()
    assert re.fullmatch(r"[0-9a-f]{32}", first.id)
    second = Incarnation.new()
    assert second.id != first.id
    assert second.started_at >= first.started_at > 1_600_000_000
    ids = {Incarnation.new().id for _ in range(200)}
    assert len(ids) == 200
    assert Incarnation.new(started_at=123.5).started_at == 123.5


def test_builder_stamps_version_and_launch_and_stays_deterministic() -> None:
    info = snapshot()
    assert info["contract_version"] == CONTRACT_VERSION == 3
    assert info["incarnation"] == {"id": "fedcba9876543210" * 2, "started_at": 1_800_000_000.5}
    assert render_server_info(snapshot()) == render_server_info(info)
    assert snapshot(FIXED.to_json()) == info
    relaunched = snapshot(Incarnation.new())
    assert relaunched["incarnation"]["id"] != info["incarnation"]["id"]
    differing = {key for key in info if info[key] != relaunched[key]}
    assert differing == {"incarnation"}
    jsonschema.Draft202012Validator(load_schema()).validate(info)


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ("abc", "must be an object"),
        ({"id": "xyz", "started_at": 1.0}, "incarnation.id"),
        ({"id": "F" * 32, "started_at": 1.0}, "incarnation.id"),
        ({"id": "f" * 31, "started_at": 1.0}, "incarnation.id"),
        ({"id": "f" * 32, "started_at": 0}, "incarnation.started_at"),
        ({"id": "f" * 32, "started_at": True}, "incarnation.started_at"),
        ({"id": "f" * 32}, "incarnation.started_at"),
        ({"id": "f" * 32, "started_at": 1.0, "pid": 7}, "unknown keys \\['pid'\\]"),
    ],
)
def test_a_bad_incarnation_is_refused_by_name(bad, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        check_incarnation(bad)
    with pytest.raises(ValueError, match=named):
        build_server_info(ARGS, READY, incarnation=bad)


def test_every_source_carries_its_encoding() -> None:
    assert describe_source(0, "tcp://*:5557", "", 16)["encoding"] == DEFAULT_ENCODING == "msgpack"
    # Upstream 0.5.22+ schedulers report sources without it: the publisher is msgpack.
    upstream = {"dp_rank": 0, "endpoint": "tcp://127.0.0.1:5557", "topic": "", "block_size": 16}
    assert aggregate_sources([upstream]) == [{**upstream, "encoding": "msgpack"}]
    other = {**upstream, "encoding": "json"}
    assert aggregate_sources([other]) == [other]
    for bad in ("", " msgpack", 3, None):
        with pytest.raises(ValueError, match="encoding must be a non-empty name"):
            aggregate_sources([{**upstream, "encoding": bad}])
        with pytest.raises(ValueError, match="encoding must be a non-empty name"):
            describe_source(0, "tcp://*:5557", "", 16, encoding=bad)


BOUNDS = {"replay_buffer_steps": 7, "hwm": 30, "max_queue_size": 0}


def test_sources_keep_the_bounds_their_publisher_reported() -> None:
    described = describe_source(0, "tcp://*:5557", "kv", 16, bounds=BOUNDS)
    assert {k: described[k] for k in SOURCE_BOUNDS} == BOUNDS
    assert aggregate_sources([described]) == [described]
    # Absent where unknown: nothing is filled in with a default.
    bare = describe_source(0, "tcp://*:5557", "kv", 16, bounds={"hwm": 5})
    assert not {"replay_buffer_steps", "max_queue_size"} & set(bare)
    assert set(aggregate_sources([bare])[0]) & set(SOURCE_BOUNDS) == {"hwm"}
    for bad in (-1, 1.5, True, "10", None):
        with pytest.raises(ValueError, match="replay_buffer_steps must be an int >= 0"):
            describe_source(0, "tcp://*:5557", "kv", 16, bounds={"replay_buffer_steps": bad})
        with pytest.raises(ValueError, match="replay_buffer_steps must be an int >= 0"):
            aggregate_sources([{**bare, "replay_buffer_steps": bad}])
    with pytest.raises(ValueError, match="unknown KV source bounds"):
        describe_source(0, "tcp://*:5557", "kv", 16, bounds={"buffer_steps": 1})


def test_bounds_are_read_from_the_objects_that_enforce_them() -> None:
    # What a ZmqEventPublisher holds: its replay deque, its PUB high-water mark, its queue.
    live = types.SimpleNamespace(
        _buffer=collections.deque(maxlen=7), _hwm=30, _event_queue=queue.Queue(maxsize=-1)
    )
    assert publisher_bounds(live) == BOUNDS
    assert publisher_bounds(types.SimpleNamespace(_hwm=5)) == {"hwm": 5}
    assert publisher_bounds(types.SimpleNamespace(_buffer=collections.deque())) == {}
    upstream = {"dp_rank": 0, "endpoint": "tcp://127.0.0.1:5557", "topic": "", "block_size": 16}
    reported = {**upstream, "hwm": 1}
    assert with_publisher_bounds([upstream, reported], BOUNDS) == [
        {**upstream, **BOUNDS},
        {**upstream, **BOUNDS, "hwm": 1},
    ]


def test_schema_reads_the_version_3_bounds() -> None:
    validator = jsonschema.Draft202012Validator(load_schema())
    sources = [describe_source(1, "tcp://*:5558", "kv", 16, "tcp://*:5601", bounds=BOUNDS)]
    info = build_server_info(ARGS, READY, incarnation=FIXED, kv_event_sources=sources)
    validator.validate(info)
    validator.validate(snapshot())  # each bound is optional
    for key in SOURCE_BOUNDS:
        broken = copy.deepcopy(info)
        broken["kv_event_sources"][0][key] = -1
        assert not validator.is_valid(broken), key


def test_schema_requires_the_version_2_fields() -> None:
    validator = jsonschema.Draft202012Validator(load_schema())
    info = snapshot()
    for key in ("contract_version", "incarnation"):
        broken = {k: v for k, v in info.items() if k != key}
        assert not validator.is_valid(broken), key
    no_encoding = copy.deepcopy(info)
    del no_encoding["kv_event_sources"][0]["encoding"]
    assert not validator.is_valid(no_encoding)
    bad_id = copy.deepcopy(info)
    bad_id["incarnation"]["id"] = "not-hex"
    assert not validator.is_valid(bad_id)


def test_probe_shows_the_launch() -> None:
    info = snapshot()
    _, findings = check_server_info(json.dumps(info))
    assert errors_of(findings) == {}
    shown = [f.message for f in findings if f.field == "incarnation" and f.level == probe.OK]
    assert shown == [f"v3, {describe_incarnation(info)}"]
    assert describe_incarnation(info, now=1_800_000_000.5 + 3725) == (
        f"launch {'fedcba9876543210' * 2} started 2027-01-15T08:00:00Z (up 1h02m)"
    )


def test_probe_names_a_contract_1_node_once() -> None:
    info = snapshot()
    del info["contract_version"], info["incarnation"]
    for source in info["kv_event_sources"]:
        del source["encoding"]
    _, findings = check_server_info(json.dumps(info))
    found = errors_of(findings)
    assert list(found) == ["contract_version"]
    assert "contract version 1" in found["contract_version"]


def test_probe_checks_version_launch_and_encoding() -> None:
    info = snapshot()
    info["incarnation"] = {"id": "12", "started_at": 5}
    info["kv_event_sources"][0]["encoding"] = "json"
    _, findings = check_server_info(json.dumps(info))
    assert errors_of(findings)["incarnation.id"] == "'12' does not match ^[0-9a-f]{32}$"
    warnings = {f.field: f.message for f in findings if f.level == probe.WARNING}
    assert warnings["kv_event_sources[0].encoding"].startswith("'json': a consumer that decodes")

    newer = snapshot()
    newer["contract_version"] = 4
    _, findings = check_server_info(json.dumps(newer))
    warnings = {f.field: f.message for f in findings if f.level == probe.WARNING}
    assert warnings["contract_version"].startswith("4 is newer than this probe knows (3)")
    assert errors_of(findings) == {}
