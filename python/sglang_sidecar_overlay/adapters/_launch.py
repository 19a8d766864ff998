"""What both adapter generations do the same way at ``load_plugins()`` and when a launch starts.

``process_registration`` is an adapter's ``register``: the one launch hook in the engine
process, the exported child groups elsewhere (``_hooks``). ``begin_node_launch`` is the first
thing that hook does. ``with_leader_sidecar`` adds the ``--sidecar`` group to a launch's hook
groups only when the launch asks for it, importing the supervisor only then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sglang_sidecar_overlay.adapters._hooks import Hook, child_groups, register

logger = logging.getLogger(__name__)

# The one target the engine process hooks at load_plugins(), on every supported release.
LAUNCH_SCHEDULERS = "sglang.srt.entrypoints.engine.Engine._launch_scheduler_processes"


def process_registration(
    around_launch: Callable[..., Any], child_hooks: Mapping[str, Sequence[Hook]]
) -> Callable[..., None]:
    """An adapter's ``register(registry, hook_type, *, main_process)``: what ``load_plugins()``
    registers, in the engine process the launch hook alone (``around_launch`` on
    :data:`LAUNCH_SCHEDULERS`), elsewhere the child groups the process's launch exported."""

    def register_hooks(registry: Any, hook_type: Any, *, main_process: bool) -> None:
        if main_process:
            register(registry, hook_type, [Hook(LAUNCH_SCHEDULERS, around_launch, "AROUND")])
            return
        for name in child_groups(child_hooks):
            register(registry, hook_type, child_hooks[name])

    return register_hooks


def begin_node_launch(server_args: Any = None) -> None:
    """A new incarnation for this launch of the node; called before its schedulers start.

    The ``dp_size`` switch and the ``--sidecar-args`` options are read here first, so a bad
    value fails the launch before any scheduler starts: on the leader too, whose reply is
    otherwise built on a first call and whose sidecar starts once the schedulers are up.
    Only the switch and the incarnation are imported here (the supervisor only with
    ``--sidecar``): the builder is imported where a reply is first built, not on every
    launch's path.
    """
    from sglang_sidecar_overlay.adapters import _sglang
    from sglang_sidecar_overlay.contract.incarnation import begin_launch
    from sglang_sidecar_overlay.contract.legacy_dp_size import legacy_dp_size_enabled

    sidecar = getattr(server_args, "sidecar", None)
    legacy_dp_size_enabled(sidecar=sidecar)
    if sidecar:
        check_sidecar_options(_sglang.sidecar_args_list(getattr(server_args, "sidecar_args", None)))
    incarnation = begin_launch()
    logger.info("node launch incarnation %s", incarnation.id)


def check_sidecar_options(sidecar_args: list[str]) -> None:
    """Raise the ValueError naming the bad option that the sidecar's start would raise."""
    from sglang_sidecar_overlay.sidecar.supervisor import SidecarOptions

    SidecarOptions.from_args(sidecar_args)


def with_leader_sidecar(
    groups: dict[str, tuple[Hook, ...]], names: Iterable[str]
) -> dict[str, tuple[Hook, ...]]:
    """``groups`` plus the ``leader_sidecar`` group when ``names`` asks for it."""
    if "leader_sidecar" in names:
        # Imported only where a sidecar runs: the supervisor is most of the overlay's code.
        from sglang_sidecar_overlay.adapters import _sidecar

        groups["leader_sidecar"] = _sidecar.LEADER_HOOKS
    return groups
