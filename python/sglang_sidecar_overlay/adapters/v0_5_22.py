"""Adapter for SGLang 0.5.22–0.5.23, which ship a basic follower metadata feature.

Upstream already advertises ``kv_event_sources`` from its schedulers and DP controller, so
nothing is hooked there. What is replaced, through SGLang's ``HookRegistry``, so that every
release gives the same contract (core aggregation and conflict checks, rank space,
redaction, legacy ``dp_size`` switch, health):

- ``sglang.srt.utils.common.build_server_info``: the core builder, for the leader's gRPC
  ``GetServerInfo`` and HTTP ``/server_info`` alike (upstream's propagation fixes the
  ``from … import`` copies in ``grpc_bridge`` and ``http_server``);
- before ``http_server.launch_server`` serves, its ``/server_info`` route is rebound to redact
  the whole body: upstream adds the schedulers' ``internal_states`` (every resolved server
  arg, only watermark secrets redacted) after the builder ran;
- ``sglang.srt.utils.common.start_follower_grpc_server``: the native follower server with
  grpc.health.v1, bound to the node's scheduler processes; upstream's follower branch still
  reaps the schedulers when it raises and stops it on exit and in ``Engine.shutdown``;
- ``Engine._launch_scheduler_processes``: observed, to learn the launch's process ids; on a
  follower its ``block_until_scheduler_exits`` fails the node when a scheduler crashed
  (upstream joins, logs and returns, so the node would exit 0).

In scheduler processes, the prefill sender registers and checks the bootstrap DP rank, the
replica's under ordinary DP (``_disagg_dp_rank``, shared with 0.5.19–0.5.21).

``SGLANG_RUST_SERVER`` mode is left to upstream: its Rust server owns the gRPC port there.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_sidecar_overlay.adapters import _common, _disagg_dp_rank, _sglang, _sidecar

logger = logging.getLogger("sglang_sidecar_overlay.adapters.v0_5_22")

BUILD_SERVER_INFO = "sglang.srt.utils.common.build_server_info"
START_FOLLOWER = "sglang.srt.utils.common.start_follower_grpc_server"
LAUNCH_SCHEDULERS = "sglang.srt.entrypoints.engine.Engine._launch_scheduler_processes"
HTTP_LAUNCH = "sglang.srt.entrypoints.http_server.launch_server"

# The launch whose follower server is about to start: one launch at a time per engine process.
_current_launch: dict[str, Any] = {}


def around_build_server_info(
    original: Any, server_args: Any, scheduler_info: Any, *args: Any, **kwargs: Any
) -> dict:
    if _sglang.rust_server_enabled():
        return original(server_args, scheduler_info, *args, **kwargs)
    return _common.node_server_info(server_args, scheduler_info)


def around_start_follower(
    original: Any, server_args: Any, scheduler_info: Any, *args: Any, **kwargs: Any
) -> Any:
    if _sglang.rust_server_enabled() or not _sglang.native_grpc_enabled():
        return original(server_args, scheduler_info, *args, **kwargs)
    init_result = _current_launch.get("init_result")
    procs = _current_launch.get("procs") or []
    pids = list(getattr(init_result, "all_child_pids", None) or []) or [p.pid for p in procs]
    return _common.start_node_follower(server_args, scheduler_info, pids)


def around_launch_schedulers(original: Any, cls: Any, *args: Any, **kwargs: Any):
    _common.begin_node_launch()
    init_result, procs = original(cls, *args, **kwargs)
    _current_launch["init_result"] = init_result
    _current_launch["procs"] = procs
    if _sglang.node_rank() >= 1:
        init_result.block_until_scheduler_exits = _common.failing_on_scheduler_crash(
            init_result.block_until_scheduler_exits, procs
        )
    return init_result, procs


def before_http_launch(*args: Any, **kwargs: Any) -> None:
    from sglang.srt.entrypoints import http_server

    _common.rebind_server_info_route(http_server, _common.redacted_body)


def register(registry: Any, hook_type: Any, *, main_process: bool) -> None:
    """Register this generation's hooks; all but the sender's live in the engine process."""
    _sidecar.register(registry, hook_type, main_process=main_process)
    _disagg_dp_rank.register(registry, hook_type, main_process=main_process)
    if not main_process:
        return
    registry.register(BUILD_SERVER_INFO, around_build_server_info, hook_type.AROUND)
    registry.register(START_FOLLOWER, around_start_follower, hook_type.AROUND)
    registry.register(LAUNCH_SCHEDULERS, around_launch_schedulers, hook_type.AROUND)
    registry.register(HTTP_LAUNCH, before_http_launch, hook_type.BEFORE)
