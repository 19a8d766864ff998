"""A node's schedulers watched where upstream's watchdog cannot see them.

Under ordinary data parallelism SGLang's engine process spawns a DP controller, which spawns
the schedulers: upstream's ``SubprocessWatchdog`` watches the controller, not them, so a
scheduler killed without raising leaves its requests waiting for ever. Once the launch's
processes are spawned, :func:`watch_spawned_schedulers` watches the DP controllers' scheduler
children and fails the node stop the way upstream does for its own children (SIGQUIT to the
engine process): the router then sees the engine go and moves its requests.
"""

from __future__ import annotations

from sglang_sidecar_overlay.adapters._node_launch import NodeLaunch
from sglang_sidecar_overlay.sidecar import proctree
from sglang_sidecar_overlay.sidecar.grandchild_watchdog import (
    GrandchildWatchdog,
    fail_stop_node,
    process_title,
)

# SGLang's process titles, as the kernel keeps them (15 bytes): ``sglang::scheduler…`` and
# ``sglang::data_parallel_controller``.
SCHEDULER_TITLE = "sglang::schedul"
DP_CONTROLLER_TITLE = "sglang::data_pa"


def is_dp_scheduler(pid: int) -> bool:
    """A scheduler whose parent is a DP controller. Only those: a process a scheduler forks
    carries the scheduler's title until it execs, and its exit is no scheduler's death."""
    stat = proctree.read_stat(pid)
    return (
        stat is not None
        and process_title(pid).startswith(SCHEDULER_TITLE)
        and process_title(stat.ppid).startswith(DP_CONTROLLER_TITLE)
    )


def watch_spawned_schedulers(launch: NodeLaunch) -> GrandchildWatchdog | None:
    """Watch the schedulers the launch's processes spawn; None when it spawned none here."""
    parents = [int(proc.pid) for proc in launch.procs if getattr(proc, "pid", None)]
    if not parents:
        return None
    watchdog = GrandchildWatchdog(parents, is_dp_scheduler, fail_stop_node)
    watchdog.start()
    return watchdog
