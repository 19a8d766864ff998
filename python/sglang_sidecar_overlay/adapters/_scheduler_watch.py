"""A node's schedulers watched where upstream's watchdog cannot see them.

Under ordinary data parallelism SGLang's engine process spawns a DP controller, which spawns
the schedulers: upstream's ``SubprocessWatchdog`` watches the controller, not them, so a
scheduler killed without raising leaves its requests waiting for ever. Once the launch's
processes are spawned, :func:`watch_spawned_schedulers` watches their scheduler children and
fails the node stop the way upstream does for its own children (SIGQUIT to the engine
process): the router then sees the engine go and moves its requests.
"""

from __future__ import annotations

from sglang_sidecar_overlay.adapters._node_launch import NodeLaunch
from sglang_sidecar_overlay.sidecar.grandchild_watchdog import (
    GrandchildWatchdog,
    fail_stop_node,
    process_title,
)

# SGLang titles a scheduler ``sglang::scheduler…``; the kernel keeps 15 bytes of it.
SCHEDULER_TITLE = "sglang::schedul"


def is_scheduler(pid: int) -> bool:
    return process_title(pid).startswith(SCHEDULER_TITLE)


def watch_spawned_schedulers(launch: NodeLaunch) -> GrandchildWatchdog | None:
    """Watch the schedulers the launch's processes spawn; None when it spawned none here."""
    parents = [int(proc.pid) for proc in launch.procs if getattr(proc, "pid", None)]
    if not parents:
        return None
    watchdog = GrandchildWatchdog(parents, is_scheduler, fail_stop_node)
    watchdog.start()
    return watchdog
