"""An upstream HTTP ``/server_info`` body through the core builder (``adapters/_server_info``).

What the leader's rebound route serves on every release: upstream's body (its builder's object
plus the extras it adds after, such as ``internal_states``) rebuilt by the core, the whole of
it redacted; on 0.5.22+ the node's publisher bounds fill in the sources upstream describes
without them.
"""

from __future__ import annotations

from sglang_sidecar_overlay.adapters import _launch, _server_info
from sglang_sidecar_overlay.contract.incarnation import CONTRACT_VERSION
from sglang_sidecar_overlay.contract.redaction import REDACTED

BOUNDS = {"replay_buffer_steps": 10, "hwm": 5, "max_queue_size": 3}
SOURCES = [
    {"dp_rank": 1, "endpoint": "tcp://127.0.0.1:5558", "topic": "", "block_size": 16, "hwm": 7},
    {"dp_rank": 0, "endpoint": "tcp://127.0.0.1:5557", "topic": "", "block_size": 16},
]
# Attention DP on 0.5.22+: one replica, two attention-DP groups.
BODY = {
    "dp_size": 1,
    "attn_dp_size": 2,
    "launch_command": "python -m sglang.launch_server --api-key hunter2",
    "status": "ready",
    "kv_event_sources": SOURCES,
    "kv_events": None,
    "internal_states": [{"api_key": "hunter2", "tp_size": 2}],
    "version": "0.5.23",
}


def test_a_body_is_rebuilt_with_the_node_bounds_where_sources_lack_them() -> None:
    launch = _launch.begin_node_launch()
    info = _server_info.rebuild_server_info(launch, BODY, BOUNDS)
    assert [source["dp_rank"] for source in info["kv_event_sources"]] == [0, 1]
    # What a source reports wins over the node's configured bound.
    assert _bounds(info) == [BOUNDS, {**BOUNDS, "hwm": 7}]
    assert info["kv_event_rank_space"]["local_ranks"] == [0, 1]
    assert info["contract_version"] == CONTRACT_VERSION
    assert info["incarnation"] == launch.incarnation.to_json()
    # Upstream's extras are kept, redacted with the rest.
    assert info["version"] == "0.5.23"
    assert info["internal_states"] == [{"api_key": REDACTED, "tp_size": 2}]
    assert "hunter2" not in info["launch_command"]


def test_without_bounds_the_sources_are_rebuilt_as_reported() -> None:
    info = _server_info.rebuild_server_info(_launch.begin_node_launch(), BODY)
    assert _bounds(info) == [{}, {"hwm": 7}]


def _bounds(info: dict) -> list[dict]:
    return [
        {key: source[key] for key in BOUNDS if key in source} for source in info["kv_event_sources"]
    ]
