"""Adapter for SGLang 0.5.19–0.5.21, which have none of the follower metadata feature.

Hooks, all through SGLang's ``HookRegistry``, each only in the processes whose role needs
it (``_hooks``: the engine process registers the launch hook at ``load_plugins()`` and the
rest when a launch starts; schedulers register what their launch exported):

- scheduler processes, with native ``--grpc-port``: every ``ZmqEventPublisher`` records the
  endpoints it bound; the ready message (``Scheduler.get_init_info``) carries
  ``kv_event_sources``, and each scheduler also drops them into the launch's side channel,
  because the DP controller of these releases runs no plugins and rebuilds its ready
  message without unknown keys;
- scheduler processes of a prefill node: the prefill sender registers and checks the
  bootstrap DP rank, the replica's under ordinary DP (``_disagg_dp_rank``, shared with
  0.5.22–0.5.23);
- engine process: ``Engine._launch_scheduler_processes`` (``_launch.launch_hook``: the node's
  launch begun, its plan's hooks installed, the side channel opened before the schedulers
  spawn); then this adapter wraps
  ``wait_for_ready`` (aggregate with the core; on a follower, start the native metadata
  server, reaping the schedulers if it cannot bind) and
  ``block_until_scheduler_exits`` (stop it, and fail the node when a scheduler crashed:
  upstream returns, and the node exits 0); on a native-gRPC follower ``Engine.shutdown``
  stops it too;
- leader with native gRPC: ``RuntimeHandle.get_server_info`` (``GetServerInfo``) answers
  with the core builder, built once per launch and served as cached text;
- leader with ``--sidecar``: the supervisor's hooks (``_sidecar``).

Not a hook: when the launch starts, ``http_server``'s ``/server_info`` route (if that module
is loaded, i.e. ``http_server.launch_server`` is launching) is rebound to pass upstream's
body through the core builder too (FastAPI bound the original function when the module was
imported, before any hook could run; the app serves only after the launch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sglang_sidecar_overlay.adapters import _disagg_dp_rank, _hooks, _launch, _plan, _sglang
from sglang_sidecar_overlay.adapters._node_launch import NodeLaunch, current_launch
from sglang_sidecar_overlay.adapters._side_channel import SideChannel, write_side_channel

PUBLISHER_SETUP = "sglang.srt.disaggregation.kv_events.ZmqEventPublisher._socket_setup"
GET_INIT_INFO = "sglang.srt.managers.scheduler.Scheduler.get_init_info"
ENGINE_SHUTDOWN = "sglang.srt.entrypoints.engine.Engine.shutdown"
LEADER_SERVER_INFO = "sglang.srt.entrypoints.grpc_bridge.RuntimeHandle.get_server_info"

FOLLOWER_ATTR = "grpc_server"


# The shared adapter modules (publisher read-back, the builder's inputs, the follower server)
# are imported where a hook first needs them: load_plugins() runs in every SGLang process,
# and most never reach that code.


def after_socket_setup(result: Any, publisher: Any, *args: Any, **kwargs: Any) -> None:
    from sglang_sidecar_overlay.adapters import _publisher

    _publisher.record_bound_endpoints(publisher)


def after_get_init_info(
    result: dict[str, Any], scheduler: Any, *args: Any, **kwargs: Any
) -> dict[str, Any]:
    if not _sglang.native_grpc_enabled():
        return result
    from sglang_sidecar_overlay.adapters import _publisher

    sources = _publisher.publisher_sources(
        getattr(scheduler, "kv_events_publisher", None), _publisher.scheduler_block_size(scheduler)
    )
    result["kv_event_sources"] = sources
    write_side_channel(sources)
    return result


def after_spawn(launch: NodeLaunch, server_args: Any, channel: SideChannel | None) -> None:
    """With native gRPC (a side channel open): the ready wait collects the node's sources
    and, on a follower, starts its metadata server; the wait on the schedulers fails on a
    crash and stops that server."""
    if channel is None:
        return
    init_result = launch.init_result
    init_result.wait_for_ready = _ready_with_sources(launch, server_args, channel)
    init_result.block_until_scheduler_exits = _block_then_stop(launch)


def _ready_with_sources(
    launch: NodeLaunch, server_args: Any, channel: SideChannel
) -> Callable[[], None]:
    init_result = launch.init_result
    wait_for_ready = init_result.wait_for_ready

    def wait_for_ready_with_sources() -> None:
        from sglang_sidecar_overlay.adapters import _server_info

        try:
            wait_for_ready()
            infos = init_result.scheduler_infos
            sources = _server_info.collected_sources(infos, channel.read())
        finally:
            channel.remove()
        if infos:
            # Where 0.5.22+ puts them: the builder reads the node's sources from here.
            infos[0]["kv_event_sources"] = sources
        if launch.follower:
            _start_follower(launch, server_args)
        elif infos:
            # Conflicting sources fail the launch here, not a consumer's first call.
            _server_info.check_node_sources(server_args, infos[0])

    return wait_for_ready_with_sources


def _block_then_stop(launch: NodeLaunch) -> Callable[[], None]:
    block_until_exit = launch.init_result.block_until_scheduler_exits

    def block_then_stop() -> None:
        from sglang_sidecar_overlay.adapters import _follower

        try:
            _follower.failing_on_scheduler_crash(block_until_exit, launch)()
        finally:
            stop_follower(launch.init_result)

    return block_then_stop


def _start_follower(launch: NodeLaunch, server_args: Any) -> None:
    from sglang_sidecar_overlay.adapters import _follower

    init_result = launch.init_result
    try:
        server = _follower.start_node_follower(launch, server_args, init_result.scheduler_infos[0])
    except BaseException:
        # The node cannot serve its metadata: do not leave its schedulers behind.
        _sglang.reap(launch.procs)
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
    """The leader's ``json_info``: the core builder's, built once per launch."""

    def build() -> str:
        from sglang_sidecar_overlay.adapters import _server_info
        from sglang_sidecar_overlay.contract.server_info import render_server_info

        launch = current_launch("the leader's GetServerInfo")
        server_args = handle.tokenizer_manager.server_args
        info = _server_info.node_server_info(launch, server_args, handle.scheduler_info)
        return render_server_info(info)

    return _launch.cached_leader_reply(handle, build)


def server_info_body(upstream: Mapping[str, Any]) -> dict[str, Any]:
    """The rebound ``/server_info``'s transform: upstream's body through the core builder."""
    from sglang_sidecar_overlay.adapters import _server_info

    return _server_info.rebuild_server_info(current_launch("/server_info"), upstream)


CHILD_HOOKS = {
    "sources": (
        _hooks.Hook(PUBLISHER_SETUP, after_socket_setup, "AFTER"),
        _hooks.Hook(GET_INIT_INFO, after_get_init_info, "AFTER"),
    ),
    "prefill_sender": _disagg_dp_rank.HOOKS,
}

ADAPTER = _launch.Adapter(
    generation=_plan.GENERATION_0_5_19,
    launch_hooks={
        "leader_grpc": (_hooks.Hook(LEADER_SERVER_INFO, leader_server_info, "REPLACE"),),
        "follower": (_hooks.Hook(ENGINE_SHUTDOWN, before_engine_shutdown, "BEFORE"),),
    },
    child_hooks=CHILD_HOOKS,
    server_info_body=server_info_body,
    after_spawn=after_spawn,
)
# load_plugins(): the launch hook in the engine process, else the child groups.
register = _launch.process_registration(ADAPTER)
