"""What both adapter generations do the same way at ``load_plugins()`` and when a launch starts.

``process_registration`` is an adapter's ``register``: the one launch hook in the engine
process, the exported child groups elsewhere (``_hooks``). ``with_leader_sidecar`` adds the
``--sidecar`` group to a launch's hook groups only when the launch asks for it, importing the
supervisor only then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sglang_sidecar_overlay.adapters._hooks import Hook, child_groups, register

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


def with_leader_sidecar(
    groups: dict[str, tuple[Hook, ...]], names: Iterable[str]
) -> dict[str, tuple[Hook, ...]]:
    """``groups`` plus the ``leader_sidecar`` group when ``names`` asks for it."""
    if "leader_sidecar" in names:
        # Imported only where a sidecar runs: the supervisor is most of the overlay's code.
        from sglang_sidecar_overlay.adapters import _sidecar

        groups["leader_sidecar"] = _sidecar.LEADER_HOOKS
    return groups
