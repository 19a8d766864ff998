"""Adapter for SGLang 0.5.19–0.5.21, which have none of the follower metadata feature.

Hooks, all through SGLang's ``HookRegistry``:

- scheduler processes: every ``ZmqEventPublisher`` records the endpoints it bound; the ready
  message (``Scheduler.get_init_info``) carries ``kv_event_sources`` when native
  ``--grpc-port`` is set, and each scheduler also drops them into the launch's side channel,
  because the DP controller of these releases runs no plugins and rebuilds its ready
  message without unknown keys;
- scheduler processes: the prefill sender registers and checks the bootstrap DP rank, the
  replica's under ordinary DP (``_disagg_dp_rank``, shared with 0.5.22–0.5.23);
- engine process: ``Engine._launch_scheduler_processes`` opens the side channel before the
  schedulers spawn and wraps ``wait_for_ready`` (aggregate with the core; on a follower,
  start the native metadata server, reaping the schedulers if it cannot bind) and
  ``block_until_scheduler_exits`` (stop it, and fail the node when a scheduler crashed:
  upstream returns, and the node exits 0); ``Engine.shutdown`` stops it too;
- leader: ``RuntimeHandle.get_server_info`` (native gRPC ``GetServerInfo``) answers with the
  core builder; before ``http_server.launch_server`` serves, its ``/server_info`` route is
  rebound to pass upstream's body through the core builder too (FastAPI bound the original
  function when the module was imported, before any hook could run).
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_sidecar_overlay.adapters import (
    _common,
    _disagg_dp_rank,
    _sglang,
    _side_channel,
    _sidecar,
)
from sglang_sidecar_overlay.contract.server_info import render_server_info

logger = logging.getLogger("sglang_sidecar_overlay.adapters.v0_5_19")

PUBLISHER_SETUP = "sglang.srt.disaggregation.kv_events.ZmqEventPublisher._socket_setup"
GET_INIT_INFO = "sglang.srt.managers.scheduler.Scheduler.get_init_info"
LAUNCH_SCHEDULERS = "sglang.srt.entrypoints.engine.Engine._launch_scheduler_processes"
ENGINE_SHUTDOWN = "sglang.srt.entrypoints.engine.Engine.shutdown"
LEADER_SERVER_INFO = "sglang.srt.entrypoints.grpc_bridge.RuntimeHandle.get_server_info"
HTTP_LAUNCH = "sglang.srt.entrypoints.http_server.launch_server"

FOLLOWER_ATTR = "grpc_server"
LEADER_JSON_ATTR = "_sidecar_overlay_server_info_json"


def after_socket_setup(result: Any, publisher: Any, *args: Any, **kwargs: Any) -> None:
    _common.record_bound_endpoints(publisher)


def after_get_init_info(result: dict, scheduler: Any, *args: Any, **kwargs: Any) -> dict:
    if not _sglang.native_grpc_enabled():
        return result
    sources = _common.publisher_sources(
        getattr(scheduler, "kv_events_publisher", None), _common.scheduler_block_size(scheduler)
    )
    result["kv_event_sources"] = sources
    _side_channel.write_side_channel(sources)
    return result


def around_launch_schedulers(original: Any, cls: Any, server_args: Any, *args: Any, **kwargs):
    _common.begin_node_launch()
    if not _sglang.native_grpc_enabled():
        return original(cls, server_args, *args, **kwargs)
    channel = _side_channel.SideChannel()
    try:
        init_result, procs = original(cls, server_args, *args, **kwargs)
    except BaseException:
        channel.unexport()
        channel.remove()
        raise
    channel.unexport()
    wait_for_ready = init_result.wait_for_ready
    block_until_exit = init_result.block_until_scheduler_exits

    def wait_for_ready_with_sources() -> None:
        try:
            wait_for_ready()
            infos = init_result.scheduler_infos
            sources = _common.collected_sources(infos, channel.read())
        finally:
            channel.remove()
        if infos:
            # Where 0.5.22+ puts them: the builder reads the node's sources from here.
            infos[0]["kv_event_sources"] = sources
        if _sglang.node_rank() >= 1:
            _start_follower(init_result, server_args, procs)
        elif infos:
            # Conflicting sources fail the launch here, not a consumer's first call.
            _common.node_server_info(server_args, infos[0])

    def block_then_stop() -> None:
        try:
            _common.failing_on_scheduler_crash(block_until_exit, procs)()
        finally:
            stop_follower(init_result)

    init_result.wait_for_ready = wait_for_ready_with_sources
    init_result.block_until_scheduler_exits = block_then_stop
    return init_result, procs


def _start_follower(init_result: Any, server_args: Any, procs: Any) -> None:
    pids = list(init_result.all_child_pids) or [p.pid for p in procs or []]
    try:
        server = _common.start_node_follower(server_args, init_result.scheduler_infos[0], pids)
    except BaseException:
        # The node cannot serve its metadata: do not leave its schedulers behind.
        _sglang.reap(procs)
        raise
    setattr(init_result, FOLLOWER_ATTR, server)


def stop_follower(init_result: Any) -> None:
    server = getattr(init_result, FOLLOWER_ATTR, None)
    if server is not None:
        server.stop()


def before_engine_shutdown(engine: Any, *args: Any, **kwargs: Any) -> None:
    init_result = getattr(engine, "_scheduler_init_result", None)
    if init_result is not None:
        stop_follower(init_result)


def leader_server_info(handle: Any) -> str:
    """The leader's ``json_info``: built on the first call, then served as cached text (server
    args and ready info do not change during a launch)."""
    cached = getattr(handle, LEADER_JSON_ATTR, None)
    if cached is None:
        info = _common.node_server_info(handle.tokenizer_manager.server_args, handle.scheduler_info)
        cached = render_server_info(info)
        setattr(handle, LEADER_JSON_ATTR, cached)
    return cached


def before_http_launch(*args: Any, **kwargs: Any) -> None:
    from sglang.srt.entrypoints import http_server

    _common.rebind_server_info_route(http_server, _common.rebuild_server_info)


def register(registry: Any, hook_type: Any, *, main_process: bool) -> None:
    """Register this generation's hooks; engine-side ones only in the engine process."""
    _sidecar.register(registry, hook_type, main_process=main_process)
    _disagg_dp_rank.register(registry, hook_type, main_process=main_process)
    registry.register(PUBLISHER_SETUP, after_socket_setup, hook_type.AFTER)
    registry.register(GET_INIT_INFO, after_get_init_info, hook_type.AFTER)
    if main_process:
        registry.register(LAUNCH_SCHEDULERS, around_launch_schedulers, hook_type.AROUND)
        registry.register(ENGINE_SHUTDOWN, before_engine_shutdown, hook_type.BEFORE)
        registry.register(LEADER_SERVER_INFO, leader_server_info, hook_type.REPLACE)
        registry.register(HTTP_LAUNCH, before_http_launch, hook_type.BEFORE)
