"""Find and signal a process tree through /proc, safe against pid reuse (stdlib only).

Used on both sides of the sidecar: by the supervisor in the server process, to reach
descendants that left the sidecar's process group, and by the shim, to reap what the
provider left behind. A process is named by ``(pid, start time)`` so a recycled pid is never
signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable

__all__ = [
    "ProcKey",
    "ProcTable",
    "descendants",
    "group_members",
    "is_running",
    "process_table",
    "signal_processes",
]

ProcKey = tuple[int, int]  # (pid, start time in clock ticks): a pid that cannot be reused
ProcTable = dict[int, tuple[int, int, int, str]]  # pid -> (ppid, pgrp, starttime, state)


def _read_stat(pid: int) -> tuple[int, int, int, str] | None:
    """(ppid, pgrp, starttime, state) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after its last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    return int(fields[1]), int(fields[2]), int(fields[19]), fields[0].decode()


def process_table() -> ProcTable:
    """Every live process: pid -> (ppid, pgrp, starttime, state)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _read_stat(int(name))
            if stat is not None:
                table[int(name)] = stat
    return table


def descendants(root: int, table: ProcTable | None = None) -> list[ProcKey]:
    """Live (non-zombie) descendants of ``root``, parents before children."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: list[ProcKey] = []
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        _, _, start, state = table[pid]
        if state != "Z":
            found.append((pid, start))
        stack.extend(children.get(pid, ()))
    return found


def group_members(pgid: int, table: ProcTable | None = None) -> list[ProcKey]:
    """Live (non-zombie) members of process group ``pgid``."""
    table = process_table() if table is None else table
    return [
        (pid, start)
        for pid, (_, pgrp, start, state) in table.items()
        if pgrp == pgid and state != "Z"
    ]


def is_running(key: ProcKey) -> bool:
    """True while the process exists and is not a zombie (zombies have already exited)."""
    stat = _read_stat(key[0])
    return stat is not None and stat[2] == key[1] and stat[3] != "Z"


def signal_processes(keys: Iterable[ProcKey], sig: int) -> None:
    """Signal each process, skipping any whose pid now belongs to someone else."""
    for pid, start in keys:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        except OSError:  # no pidfd support: accept the small pid-reuse window of kill()
            stat = _read_stat(pid)
            if stat is not None and stat[2] == start:
                _kill_quietly(pid, sig)
            continue
        try:
            stat = _read_stat(pid)
            # The pidfd pins this pid: if its start time still matches, it is our process.
            if stat is not None and stat[2] == start:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, sig)
        finally:
            os.close(fd)


def _kill_quietly(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)
