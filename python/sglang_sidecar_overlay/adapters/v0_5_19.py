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
- engine process: ``Engine._launch_scheduler_processes`` begins the launch's incarnation,
  installs the launch's hooks, opens the side channel before the schedulers spawn and wraps
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

from typing import Any

from sglang_sidecar_overlay.adapters import _disagg_dp_rank, _hooks, _launch, _sglang, _side_channel

PUBLISHER_SETUP = "sglang.srt.disaggregation.kv_events.ZmqEventPublisher._socket_setup"
GET_INIT_INFO = "sglang.srt.managers.scheduler.Scheduler.get_init_info"
ENGINE_SHUTDOWN = "sglang.srt.entrypoints.engine.Engine.shutdown"
LEADER_SERVER_INFO = "sglang.srt.entrypoints.grpc_bridge.RuntimeHandle.get_server_info"

FOLLOWER_ATTR = "grpc_server"
LEADER_JSON_ATTR = "_sidecar_overlay_server_info_json"


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
    _side_channel.write_side_channel(sources)
    return result


def launch_groups() -> list[str]:
    """The launch-time hook groups this node's role needs (read from the published config)."""
    native_grpc = _sglang.native_grpc_enabled()
    if _sglang.node_rank() >= 1:
        return ["follower"] if native_grpc else []
    module, _ = _sglang.sidecar_config()
    return (["leader_grpc"] if native_grpc else []) + (["leader_sidecar"] if module else [])


def _launch_hooks(names: list[str]) -> dict[str, tuple[_hooks.Hook, ...]]:
    groups: dict[str, tuple[_hooks.Hook, ...]] = {
        "leader_grpc": (_hooks.Hook(LEADER_SERVER_INFO, leader_server_info, "REPLACE"),),
        "follower": (_hooks.Hook(ENGINE_SHUTDOWN, before_engine_shutdown, "BEFORE"),),
    }
    return _launch.with_leader_sidecar(groups, names)


def install_launch_hooks(names: list[str] | None = None) -> list[str]:
    """Install the hooks this node's launch needs (``names``: :func:`launch_groups`) and
    rebind the HTTP ``/server_info`` route if ``http_server`` is loaded.

    Idempotent per process; returns the hook groups it added.
    """
    from sglang_sidecar_overlay.adapters import _http_route, _server_info

    _http_route.rebind_loaded_server_info_route(_server_info.rebuild_server_info)
    names = launch_groups() if names is None else names
    return _hooks.installed.install(_launch_hooks(names), names)


def _child_groups(server_args: Any) -> list[str]:
    groups = ["sources"] if _sglang.native_grpc_enabled() else []
    return groups + (["prefill_sender"] if _disagg_dp_rank.prefill_node(server_args) else [])


def around_launch_schedulers(
    original: Any, cls: Any, server_args: Any, *args: Any, **kwargs: Any
) -> Any:
    _launch.begin_node_launch(server_args)
    install_launch_hooks()
    if not _sglang.native_grpc_enabled():
        with _hooks.exported_child_groups(_child_groups(server_args)):
            return original(cls, server_args, *args, **kwargs)
    channel = _side_channel.SideChannel()
    try:
        with _hooks.exported_child_groups(_child_groups(server_args)):
            init_result, procs = original(cls, server_args, *args, **kwargs)
    except BaseException:
        channel.unexport()
        channel.remove()
        raise
    channel.unexport()
    wait_for_ready = init_result.wait_for_ready
    block_until_exit = init_result.block_until_scheduler_exits

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
        if _sglang.node_rank() >= 1:
            _start_follower(init_result, server_args, procs)
        elif infos:
            # Conflicting sources fail the launch here, not a consumer's first call.
            _server_info.node_server_info(server_args, infos[0])

    def block_then_stop() -> None:
        from sglang_sidecar_overlay.adapters import _follower

        try:
            _follower.failing_on_scheduler_crash(block_until_exit, procs)()
        finally:
            stop_follower(init_result)

    init_result.wait_for_ready = wait_for_ready_with_sources
    init_result.block_until_scheduler_exits = block_then_stop
    return init_result, procs


def _start_follower(init_result: Any, server_args: Any, procs: Any) -> None:
    from sglang_sidecar_overlay.adapters import _follower

    pids = list(init_result.all_child_pids) or [p.pid for p in procs or []]
    try:
        server = _follower.start_node_follower(server_args, init_result.scheduler_infos[0], pids)
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
        from sglang_sidecar_overlay.adapters import _server_info
        from sglang_sidecar_overlay.contract.server_info import render_server_info

        info = _server_info.node_server_info(
            handle.tokenizer_manager.server_args, handle.scheduler_info
        )
        cached = render_server_info(info)
        setattr(handle, LEADER_JSON_ATTR, cached)
        _server_info.log_leader_reply_built(cached)
    return cached


CHILD_HOOKS = {
    "sources": (
        _hooks.Hook(PUBLISHER_SETUP, after_socket_setup, "AFTER"),
        _hooks.Hook(GET_INIT_INFO, after_get_init_info, "AFTER"),
    ),
    "prefill_sender": _disagg_dp_rank.HOOKS,
}


# load_plugins(): the launch hook in the engine process, else the child groups.
register = _launch.process_registration(around_launch_schedulers, CHILD_HOOKS)
