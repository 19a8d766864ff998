"""A node's launch, the same on every adapter generation: its hook, its plan, its hooks.

``process_registration`` builds an adapter's ``register``: at ``load_plugins()`` the one
launch hook in the engine process, the exported child groups elsewhere (``_hooks``).
:func:`launch_hook` is that launch hook: :func:`begin_node_launch` (the launch's
:class:`~sglang_sidecar_overlay.adapters._node_launch.NodeLaunch`), the groups
``_plan.launch_plan`` chose installed, the schedulers spawned with their groups (and, before
0.5.22, the side channel), then the adapter's own step once they are spawned. An
:class:`Adapter` says only what differs between releases: the hooks behind each group name,
the ``/server_info`` transform and that last step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from sglang_sidecar_overlay.adapters import _scheduler_watch
from sglang_sidecar_overlay.adapters._disagg_dp_rank import prefill_node
from sglang_sidecar_overlay.adapters._hooks import (
    Hook,
    child_groups,
    exported_to_children,
    install_groups,
    register,
)
from sglang_sidecar_overlay.adapters._node_launch import PROCESS, NodeLaunch, announce_launch
from sglang_sidecar_overlay.adapters._plan import GENERATION_0_5_22, launch_plan

if TYPE_CHECKING:
    from sglang_sidecar_overlay.sidecar.supervisor import SidecarOptions

logger = logging.getLogger(__name__)

# The one target the engine process hooks at load_plugins(), on every supported release.
LAUNCH_SCHEDULERS = "sglang.srt.entrypoints.engine.Engine._launch_scheduler_processes"
# Where the leader's GetServerInfo text is cached for the rest of its launch.
LEADER_JSON_ATTR = "_sidecar_overlay_server_info_json"


class Adapter(NamedTuple):
    """What one API generation does its own way; everything else is this module's."""

    generation: str
    # The engine-side hooks behind each launch group name (``leader_sidecar`` is shared).
    launch_hooks: Mapping[str, tuple[Hook, ...]]
    # The hooks behind each child group name.
    child_hooks: Mapping[str, Sequence[Hook]]
    # Upstream's ``/server_info`` body → the contract's.
    server_info_body: Callable[[Mapping[str, Any]], dict[str, Any]]
    # Once the schedulers are spawned: (launch, server args, side channel or None).
    after_spawn: Callable[[NodeLaunch, Any, Any], None]


def process_registration(adapter: Adapter) -> Callable[..., None]:
    """An adapter's ``register(registry, hook_type, *, main_process)``: what ``load_plugins()``
    registers, in the engine process the launch hook alone (:func:`launch_hook` on
    :data:`LAUNCH_SCHEDULERS`), elsewhere the child groups the process's launch exported."""

    def register_hooks(registry: Any, hook_type: Any, *, main_process: bool) -> None:
        if main_process:
            hook = Hook(LAUNCH_SCHEDULERS, launch_hook(adapter), "AROUND")
            register(registry, hook_type, [hook])
            return
        for name in child_groups(adapter.child_hooks):
            register(registry, hook_type, adapter.child_hooks[name])

    return register_hooks


def _arg(server_args: Any, name: str) -> Any:
    if isinstance(server_args, Mapping):
        return server_args.get(name)
    return getattr(server_args, name, None)


def begin_node_launch(
    server_args: Any = None,
    *,
    generation: str = GENERATION_0_5_22,
    follower: bool = False,
    native_grpc: bool = False,
) -> NodeLaunch:
    """This node's launch, begun before its schedulers start: the process's current launch
    from now on (``_node_launch.current_launch``).

    The launch hook calls it; so does code that builds an engine outside SGLang's launch path
    on purpose (an in-process test, a benchmark), before the hooks that need a launch run.

    The ``dp_size`` switch and the ``--sidecar-args`` options are read here, once, so a bad
    value fails the launch before any scheduler starts and before a new incarnation: on the
    leader too, whose reply is otherwise built on a first call and whose sidecar starts once
    the schedulers are up. The supervisor is imported only with ``--sidecar``.
    """
    from sglang_sidecar_overlay.adapters import _sglang
    from sglang_sidecar_overlay.contract.incarnation import Incarnation
    from sglang_sidecar_overlay.contract.legacy_dp_size import (
        LEGACY_DP_SIZE_ENV,
        legacy_dp_size_decision,
        legacy_dp_size_enabled,
    )

    module = _arg(server_args, "sidecar")
    sidecar = module.strip() if isinstance(module, str) and module.strip() else None
    legacy = legacy_dp_size_enabled(sidecar=sidecar)
    options: SidecarOptions | None = None
    provider_args: list[str] = []
    if sidecar:
        from sglang_sidecar_overlay.sidecar.supervisor import SidecarOptions as Options

        raw_args = _sglang.sidecar_args_list(_arg(server_args, "sidecar_args"))
        options, provider_args = Options.from_args(raw_args)
    plan = launch_plan(
        generation,
        follower=follower,
        native_grpc=native_grpc,
        sidecar=sidecar is not None,
        prefill=prefill_node(server_args),
    )
    launch = NodeLaunch(
        Incarnation.new(),
        plan,
        follower=follower,
        legacy_dp_size=legacy,
        sidecar=sidecar,
        sidecar_options=options,
        provider_args=provider_args,
    )
    announce_launch(launch)
    logger.info("node launch incarnation %s", launch.incarnation.id)
    if legacy or LEGACY_DP_SIZE_ENV in os.environ:
        logger.info("%s", legacy_dp_size_decision(legacy, sidecar))
    return launch


def with_leader_sidecar(
    groups: Mapping[str, tuple[Hook, ...]], names: Iterable[str]
) -> dict[str, tuple[Hook, ...]]:
    """``groups`` plus the ``leader_sidecar`` group when ``names`` asks for it."""
    added = dict(groups)
    if "leader_sidecar" in names:
        # Imported only where a sidecar runs: the supervisor is most of the overlay's code.
        from sglang_sidecar_overlay.adapters import _sidecar

        added["leader_sidecar"] = _sidecar.LEADER_HOOKS
    return added


def install_launch_hooks(adapter: Adapter, names: Iterable[str]) -> list[str]:
    """Install the named launch groups (each once per process) and rebind the HTTP
    ``/server_info`` route if ``http_server`` is loaded; returns the groups added.

    The launch hook calls it; so do in-process tests and benchmarks that begin a launch
    themselves (``begin_node_launch``), with the adapter module's ``ADAPTER``.
    """
    from sglang_sidecar_overlay.adapters import _http_route

    _http_route.rebind_loaded_server_info_route(adapter.server_info_body)
    names = list(names)
    groups = with_leader_sidecar(adapter.launch_hooks, names)
    return install_groups(PROCESS.installed_hooks, PROCESS.hooks_lock, groups, names)


def launch_hook(adapter: Adapter) -> Callable[..., tuple[Any, Any]]:
    """The AROUND hook on :data:`LAUNCH_SCHEDULERS` for ``adapter``."""

    def around_launch_schedulers(
        original: Any, cls: Any, server_args: Any, *args: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        from sglang_sidecar_overlay.adapters import _sglang

        launch = begin_node_launch(
            server_args,
            generation=adapter.generation,
            follower=_sglang.node_rank() >= 1,
            native_grpc=_sglang.native_grpc_enabled(),
        )
        install_launch_hooks(adapter, launch.plan.launch)
        channel = _open_side_channel() if launch.plan.side_channel else None
        try:
            with exported_to_children(launch.plan.children, channel and channel.path):
                init_result, procs = original(cls, server_args, *args, **kwargs)
        except BaseException:
            if channel is not None:
                channel.remove()
            raise
        launch.record_schedulers(init_result, procs)
        _scheduler_watch.watch_spawned_schedulers(launch)
        adapter.after_spawn(launch, server_args, channel)
        return init_result, procs

    return around_launch_schedulers


def _open_side_channel() -> Any:
    from sglang_sidecar_overlay.adapters._side_channel import SideChannel

    return SideChannel()


def cached_leader_reply(handle: Any, build: Callable[[], str]) -> str:
    """The leader's ``json_info``: ``build()`` on the first call, then cached text (server args
    and ready info do not change during a launch)."""
    cached = getattr(handle, LEADER_JSON_ATTR, None)
    if cached is None:
        cached = build()
        setattr(handle, LEADER_JSON_ATTR, cached)
        logger.info(
            "leader GetServerInfo reply built (%d bytes), served as cached text for this launch",
            len(cached),
        )
    return str(cached)
