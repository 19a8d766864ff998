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
  engine process (``_launch.launch_hook``). It begins the node's launch, installs the hooks
  above that its plan names (with native gRPC the cached ``GetServerInfo`` and with
  ``--sidecar`` the leader sidecar on the leader; the follower server on a native-gRPC
  follower), tells the schedulers it spawns which hooks they need, and records the launch's
  processes for the follower server. On a follower, this adapter makes its
  ``block_until_scheduler_exits`` fail the node when a scheduler crashed (upstream joins,
  logs and returns, so the node would exit 0).

In scheduler processes of a prefill node, the prefill sender registers and checks the
bootstrap DP rank, the replica's under ordinary DP (``_disagg_dp_rank``, shared with
0.5.19–0.5.21).

``SGLANG_RUST_SERVER`` mode is left to upstream: its Rust server owns the gRPC port there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from sglang_sidecar_overlay.adapters import _disagg_dp_rank, _hooks, _launch, _plan, _sglang
from sglang_sidecar_overlay.adapters._node_launch import NodeLaunch, current_launch

START_FOLLOWER = "sglang.srt.utils.common.start_follower_grpc_server"
LEADER_SERVER_INFO = "sglang.srt.entrypoints.grpc_bridge.RuntimeHandle.get_server_info"


def around_start_follower(
    original: Any, server_args: Any, scheduler_info: Any, *args: Any, **kwargs: Any
) -> Any:
    if _sglang.rust_server_enabled() or not _sglang.native_grpc_enabled():
        return original(server_args, scheduler_info, *args, **kwargs)
    from sglang_sidecar_overlay.adapters import _follower

    # Upstream passes only server args and ready info: the scheduler processes to watch
    # are the launch's.
    launch = current_launch("the follower metadata server's start")
    return _follower.start_node_follower(launch, server_args, scheduler_info)


def around_leader_server_info(original: Any, handle: Any, *args: Any, **kwargs: Any) -> str:
    """The leader's ``json_info``: the core's, with upstream's extras, built once per launch."""
    if _sglang.rust_server_enabled():
        return cast(str, original(handle, *args, **kwargs))

    def build() -> str:
        from sglang_sidecar_overlay.adapters import _server_info

        return _server_info.leader_grpc_reply(
            current_launch("the leader's GetServerInfo"),
            original(handle, *args, **kwargs),
            handle.tokenizer_manager.server_args,
            handle.scheduler_info,
        )

    return _launch.cached_leader_reply(handle, build)


def server_info_body(upstream: Mapping[str, Any]) -> dict[str, Any]:
    """The rebound ``/server_info``'s transform: upstream's body through the core builder."""
    # Imported at the first request, not when the launch rebinds the route.
    from sglang_sidecar_overlay.adapters import _server_info

    return _server_info.rebuild_with_node_bounds(current_launch("/server_info"), upstream)


def after_spawn(launch: NodeLaunch, server_args: Any, channel: Any) -> None:
    """On a follower, the wait on the schedulers fails the node when one crashed."""
    if not launch.follower:
        return
    from sglang_sidecar_overlay.adapters import _follower

    init_result = launch.init_result
    init_result.block_until_scheduler_exits = _follower.failing_on_scheduler_crash(
        init_result.block_until_scheduler_exits, launch
    )


ADAPTER = _launch.Adapter(
    generation=_plan.GENERATION_0_5_22,
    launch_hooks={
        "leader_grpc": (_hooks.Hook(LEADER_SERVER_INFO, around_leader_server_info, "AROUND"),),
        "follower": (_hooks.Hook(START_FOLLOWER, around_start_follower, "AROUND"),),
    },
    child_hooks={"prefill_sender": _disagg_dp_rank.HOOKS},
    server_info_body=server_info_body,
    after_spawn=after_spawn,
)
# load_plugins(): the launch hook in the engine process, else the child groups.
register = _launch.process_registration(ADAPTER)
