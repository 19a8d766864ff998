"""Find and signal a process tree through /proc, safe against pid reuse (stdlib only).

Used on both sides of the sidecar: by the supervisor in the server process, to reach
descendants that left the sidecar's process group, and by the shim, to reap what the
provider left behind. A process is named by ``(pid, start time)`` so a recycled pid is never
signalled. ``read_stat`` is the one reader of ``/proc/PID/stat``; ``signal_name`` names the
signal a child's negative return code stands for.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from typing import NamedTuple

__all__ = [
    "ProcKey",
    "ProcStat",
    "ProcTable",
    "descendants",
    "group_members",
    "is_running",
    "process_table",
    "read_stat",
    "signal_name",
    "signal_processes",
]

ProcKey = tuple[int, int]  # (pid, start time in clock ticks): a pid that cannot be reused


class ProcStat(NamedTuple):
    """The fields of ``/proc/PID/stat`` this project reads (times in clock ticks)."""

    state: str
    ppid: int
    pgrp: int
    session: int
    utime: int
    stime: int
    starttime: int


ProcTable = dict[int, ProcStat]


def read_stat(pid: int) -> ProcStat | None:
    """``/proc/PID/stat`` of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after its last ')'. Field 3
    # (state) is fields[0] here, so field N is fields[N - 3].
    fields = raw[raw.rfind(b")") + 2 :].split()
    return ProcStat(
        state=fields[0].decode(),
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        session=int(fields[3]),
        utime=int(fields[11]),
        stime=int(fields[12]),
        starttime=int(fields[19]),
    )


def process_table() -> ProcTable:
    """Every live process by pid."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = read_stat(int(name))
            if stat is not None:
                table[int(name)] = stat
    return table


def descendants(root: int, table: ProcTable | None = None) -> list[ProcKey]:
    """Live (non-zombie) descendants of ``root``, parents before children."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, stat in table.items():
        children.setdefault(stat.ppid, []).append(pid)
    found: list[ProcKey] = []
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if table[pid].state != "Z":
            found.append((pid, table[pid].starttime))
        stack.extend(children.get(pid, ()))
    return found


def group_members(pgid: int, table: ProcTable | None = None) -> list[ProcKey]:
    """Live (non-zombie) members of process group ``pgid``."""
    table = process_table() if table is None else table
    return [
        (pid, stat.starttime)
        for pid, stat in table.items()
        if stat.pgrp == pgid and stat.state != "Z"
    ]


def is_running(key: ProcKey) -> bool:
    """True while the process exists and is not a zombie (zombies have already exited)."""
    stat = read_stat(key[0])
    return stat is not None and stat.starttime == key[1] and stat.state != "Z"


def signal_processes(keys: Iterable[ProcKey], sig: int) -> None:
    """Signal each process, skipping any whose pid now belongs to someone else."""
    for pid, start in keys:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        except OSError:  # no pidfd support: accept the small pid-reuse window of kill()
            stat = read_stat(pid)
            if stat is not None and stat.starttime == start:
                _kill_quietly(pid, sig)
            continue
        try:
            stat = read_stat(pid)
            # The pidfd pins this pid: if its start time still matches, it is our process.
            if stat is not None and stat.starttime == start:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, sig)
        finally:
            os.close(fd)


def _kill_quietly(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def signal_name(signum: int) -> str | None:
    """``SIGKILL`` for 9; None for a number that names no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return None
