"""CPU seconds each part of a deployment used over a window of a fault row: the evidence for
who took the cores when a window served fewer tokens. On a CPU-only machine every engine is
CPU-bound, so a window's throughput is the share of the cores its schedulers got."""

from __future__ import annotations

import os
from pathlib import Path

from sglang_sidecar_overlay.sidecar import proctree

from overlay_harness import nodes
from overlay_harness.deployments import Deployment
from overlay_harness.fault_rows import SCHEDULER_COMM

TICKS = os.sysconf("SC_CLK_TCK")
MACHINE = "the whole machine"


def parts_of(deployment: Deployment) -> dict[str, list[int]]:
    """The deployment's processes by part: the engines' schedulers, the rest of the engines
    (their launchers, tokenizers, sidecars), Dynamo's frontend and its oracle router(s)."""
    schedulers, engines = [], []
    for pid in nodes.pids_of_tree([node.proc.pid for node in deployment.nodes]):
        try:
            comm = Path(f"/proc/{pid}/comm").read_bytes().strip()
        except OSError:
            continue
        (schedulers if comm.startswith(SCHEDULER_COMM) else engines).append(pid)
    routers = getattr(deployment.router, "routers", [deployment.router])
    return {
        "schedulers": schedulers,
        "the rest of the engines": engines,
        "frontend": nodes.pids_of_tree([deployment.frontend.proc.pid]),
        "router": nodes.pids_of_tree([router.proc.pid for router in routers]),
    }


def sample(parts: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds used so far by each part's live processes, and by the whole machine."""
    used = {}
    for part, pids in parts.items():
        ticks = 0
        for pid in pids:
            stat = proctree.read_stat(pid)
            if stat is not None:
                ticks += stat.utime + stat.stime
        used[part] = ticks / TICKS
    used[MACHINE] = _machine_busy_seconds()
    return used


def _machine_busy_seconds() -> float:
    """Every core's non-idle time so far (``/proc/stat``'s first line, less idle and iowait)."""
    fields = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / TICKS


def used_between(begin: dict[str, float], end: dict[str, float]) -> dict[str, float]:
    """CPU seconds each part used between two samples."""
    return {part: end[part] - begin[part] for part in begin}


def summed(windows: list[dict[str, float]]) -> dict[str, float]:
    """Each part's CPU seconds over several windows."""
    return {part: sum(window[part] for window in windows) for part in windows[0]}


def describe(before: dict[str, float], during: dict[str, float]) -> str:
    """'part before → during' for every part, in CPU seconds."""
    return ", ".join(f"{part} {before[part]:.1f} → {during[part]:.1f}" for part in before)
