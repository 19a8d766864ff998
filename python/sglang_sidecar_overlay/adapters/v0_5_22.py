"""Adapter for SGLang 0.5.22–0.5.23, which ship a basic follower metadata feature.

Upstream already advertises ``kv_event_sources`` from its schedulers and DP controller, so
nothing is hooked there. What is replaced, through SGLang's ``HookRegistry``, so that every
release gives the same contract (core aggregation and conflict checks, rank space,
redaction, legacy ``dp_size`` switch, health):

- ``RuntimeHandle.get_server_info`` (native gRPC ``GetServerInfo`` on the leader): the core
  builder's object for the handle's server args and ready info, with SGLang's watermark
  redaction and the keys upstream's reply adds after its builder (0.5.23: ``grpc_features``),
  built on the first call and served as cached text for the rest of the launch. Everything in
  it is fixed at launch: ``resolved_dict()`` reads the server args record, not the config
  overrides a weight update records, the ready info is the launch's, and the media features
  come from the model;
- not a hook: when the launch starts, ``http_server``'s ``/server_info`` route (if that module
  is loaded) is rebound to pass upstream's body through the core builder, per request,
  because upstream merges live values (``internal_states``: every resolved server arg, only
  watermark secrets redacted) into that body; the whole body comes out redacted, its sources
  with the node's publisher bounds. SGLang's module-level ``build_server_info`` is not
  hooked: the registry walks every loaded module after patching a module-level function
  (``_hooks``), and its two leader callers are reached through a method and the route;
- ``sglang.srt.utils.common.start_follower_grpc_server``: the native follower server with
  grpc.health.v1, bound to the node's scheduler processes; upstream's follower branch still
  reaps the schedulers when it raises and stops it on exit and in ``Engine.shutdown``;
- ``Engine._launch_scheduler_processes``: the one hook ``load_plugins()`` registers in the
  engine process (``_hooks``). It begins the launch's incarnation, installs the hooks above
  that the node's role needs (with native gRPC the cached ``GetServerInfo`` and with
  ``--sidecar`` the leader sidecar on the leader; the follower server on a native-gRPC
  follower), tells the schedulers it spawns which hooks they need, and records the launch's
  processes for the follower server. On a follower, its ``block_until_scheduler_exits`` fails
  the node when a scheduler crashed (upstream joins, logs and returns, so the node would exit
  0).

In scheduler processes of a prefill node, the prefill sender registers and checks the
bootstrap DP rank, the replica's under ordinary DP (``_disagg_dp_rank``, shared with
0.5.19–0.5.21).

``SGLANG_RUST_SERVER`` mode is left to upstream: its Rust server owns the gRPC port there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from sglang_sidecar_overlay.adapters import _disagg_dp_rank, _hooks, _launch, _sglang

START_FOLLOWER = "sglang.srt.utils.common.start_follower_grpc_server"
LEADER_SERVER_INFO = "sglang.srt.entrypoints.grpc_bridge.RuntimeHandle.get_server_info"
LEADER_JSON_ATTR = "_sidecar_overlay_server_info_json"


class CurrentLaunch:
    """The engine process's launch whose follower server is about to start.

    ``start_follower_grpc_server`` receives only server args and ready info; the scheduler
    processes it must watch come from here (an engine process launches one node at a time).
    """

    def __init__(self) -> None:
        self.init_result: Any = None
        self.procs: list[Any] = []

    def record(self, init_result: Any, procs: Any) -> None:
        self.init_result = init_result
        self.procs = list(procs or [])

    def scheduler_pids(self) -> list[int]:
        pids = list(getattr(self.init_result, "all_child_pids", None) or [])
        return pids or [p.pid for p in self.procs]


current_launch = CurrentLaunch()


def around_start_follower(
    original: Any, server_args: Any, scheduler_info: Any, *args: Any, **kwargs: Any
) -> Any:
    if _sglang.rust_server_enabled() or not _sglang.native_grpc_enabled():
        return original(server_args, scheduler_info, *args, **kwargs)
    from sglang_sidecar_overlay.adapters import _follower

    return _follower.start_node_follower(
        server_args, scheduler_info, current_launch.scheduler_pids()
    )


def around_leader_server_info(original: Any, handle: Any, *args: Any, **kwargs: Any) -> str:
    """The leader's ``json_info``: the core's, with upstream's extras, built once per launch,
    then cached text."""
    if _sglang.rust_server_enabled():
        return cast(str, original(handle, *args, **kwargs))
    cached = getattr(handle, LEADER_JSON_ATTR, None)
    if cached is None:
        from sglang_sidecar_overlay.adapters import _server_info

        cached = _server_info.leader_grpc_reply(
            original(handle, *args, **kwargs),
            handle.tokenizer_manager.server_args,
            handle.scheduler_info,
        )
        setattr(handle, LEADER_JSON_ATTR, cached)
        _server_info.log_leader_reply_built(cached)
    return cached


def launch_groups() -> list[str]:
    """The launch-time hook groups this node's role needs (read from the published config)."""
    if _sglang.node_rank() >= 1:
        return ["follower"] if _sglang.native_grpc_enabled() else []
    module, _ = _sglang.sidecar_config()
    grpc = ["leader_grpc"] if _sglang.native_grpc_enabled() else []
    return [*grpc, *(["leader_sidecar"] if module else [])]


def _launch_hooks(names: list[str]) -> dict[str, tuple[_hooks.Hook, ...]]:
    groups: dict[str, tuple[_hooks.Hook, ...]] = {
        "leader_grpc": (_hooks.Hook(LEADER_SERVER_INFO, around_leader_server_info, "AROUND"),),
        "follower": (_hooks.Hook(START_FOLLOWER, around_start_follower, "AROUND"),),
    }
    return _launch.with_leader_sidecar(groups, names)


def install_launch_hooks(names: list[str] | None = None) -> list[str]:
    """Install the hooks this node's launch needs (``names``: :func:`launch_groups`) and
    rebind the HTTP ``/server_info`` route to the core builder if ``http_server`` is loaded.

    Idempotent per process; returns the groups it added.
    """
    from sglang_sidecar_overlay.adapters import _http_route

    _http_route.rebind_loaded_server_info_route(rebuilt_server_info_body)
    names = launch_groups() if names is None else names
    return _hooks.installed.install(_launch_hooks(names), names)


def rebuilt_server_info_body(upstream: Mapping[str, Any]) -> dict[str, Any]:
    """The rebound ``/server_info``'s transform: upstream's body through the core builder."""
    # Imported at the first request, not when the launch rebinds the route.
    from sglang_sidecar_overlay.adapters import _server_info

    return _server_info.rebuild_with_node_bounds(upstream)


def around_launch_schedulers(
    original: Any, cls: Any, server_args: Any, *args: Any, **kwargs: Any
) -> tuple[Any, Any]:
    _launch.begin_node_launch(server_args)
    install_launch_hooks()
    children = ["prefill_sender"] if _disagg_dp_rank.prefill_node(server_args) else []
    with _hooks.exported_child_groups(children):
        init_result, procs = original(cls, server_args, *args, **kwargs)
    current_launch.record(init_result, procs)
    if _sglang.node_rank() >= 1:
        from sglang_sidecar_overlay.adapters import _follower

        init_result.block_until_scheduler_exits = _follower.failing_on_scheduler_crash(
            init_result.block_until_scheduler_exits, procs
        )
    return init_result, procs


CHILD_HOOKS = {"prefill_sender": _disagg_dp_rank.HOOKS}


# load_plugins(): the launch hook in the engine process, else the child groups.
register = _launch.process_registration(around_launch_schedulers, CHILD_HOOKS)
