"""Fail-stop on the death of a process that upstream's watchdog cannot see (stdlib only).

SGLang's ``SubprocessWatchdog`` watches the engine process's own children. Under ordinary
data parallelism the schedulers are the DP controller's children, one level further down: a
scheduler that dies without raising (SIGKILL, the kernel's OOM killer) tells nobody, and the
requests the DP controller gave it wait for ever. :class:`GrandchildWatchdog` watches the
children of given parents (the node's DP controllers) that a predicate picks (SGLang's
schedulers, by their title), and calls ``on_crash`` once when one of them dies while its
parent lives. A parent that dies too within ``parent_grace`` means a teardown (SGLang kills
the whole tree on shutdown) or a crash of the parent itself, which upstream's watchdog sees.

The children are found by rescanning each parent's ``/proc`` children every ``rescan``
seconds, since a DP controller spawns its schedulers after the engine process hooked in.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Callable, Iterable
from typing import cast

logger = logging.getLogger(__name__)

RESCAN_S = 1.0
PARENT_GRACE_S = 0.5


def fail_stop_node(description: str) -> None:
    """What upstream's watchdog does when a child crashes: SIGQUIT to this (the engine)
    process, whose SGLang handler kills the node's whole process tree."""
    logger.error("%s; triggering SIGQUIT to bring the server down", description)
    os.kill(os.getpid(), signal.SIGQUIT)


def children(pid: int) -> list[int]:
    """The live children of ``pid`` (every thread's), from ``/proc``; [] when it is gone."""
    found: list[int] = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        with contextlib.suppress(OSError), open(path) as f:
            found.extend(int(child) for child in f.read().split())
    return found


def process_title(pid: int) -> str:
    """``/proc/PID/comm`` (the title, cut to 15 bytes by the kernel); '' when it is gone."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip().decode(errors="replace")
    except OSError:
        return ""


class GrandchildWatchdog:
    """Watches the children of ``parents`` that ``picked`` selects (see the module docstring)."""

    def __init__(
        self,
        parents: Iterable[int],
        picked: Callable[[int], bool],
        on_crash: Callable[[str], None],
        *,
        rescan: float = RESCAN_S,
        parent_grace: float = PARENT_GRACE_S,
    ) -> None:
        self.parents = sorted(set(parents))
        self.picked = picked
        self.on_crash = on_crash
        self.rescan = rescan
        self.parent_grace = parent_grace
        self._wake_r, self._wake_w = os.pipe()
        self._parent_fds: dict[int, int] = {}
        self._child_fds: dict[int, tuple[int, int, str]] = {}  # fd -> (child, parent, title)
        self._thread: threading.Thread | None = None
        # Held while the wake pipe is written or closed: a stop() after the thread ended must
        # not write to a descriptor number the process has since reused.
        self._wake_lock = threading.Lock()
        self.crashed: int | None = None

    def start(self) -> None:
        """Begin watching on a daemon thread; parents already gone are skipped."""
        for parent in self.parents:
            with contextlib.suppress(ProcessLookupError):
                self._parent_fds[parent] = os.pidfd_open(parent)
        self._thread = threading.Thread(
            target=self._run, name="overlay-grandchild-watchdog", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the thread ends and closes its descriptors). Idempotent."""
        with self._wake_lock:
            if self._wake_w >= 0:
                os.write(self._wake_w, b"x")
        if self._thread is None:
            self._close_descriptors()  # never started: no thread will close them
        elif self._thread is not threading.current_thread():
            self._thread.join(timeout=self.rescan + 1.0)

    def _run(self) -> None:
        try:
            while live := self._live_parents():
                self._adopt_new_children(live)
                ready = multiprocessing.connection.wait(
                    [self._wake_r, *self._child_fds], timeout=self.rescan
                )
                if self._wake_r in ready:
                    return
                for fd in cast(list[int], ready):  # only pipes and pidfds were waited on
                    os.close(fd)
                    if self._crashed(*self._child_fds.pop(fd)):
                        return
        finally:
            self._close_descriptors()

    def _close_descriptors(self) -> None:
        if self._wake_r < 0:
            return
        for fd in [*self._child_fds, *self._parent_fds.values()]:
            os.close(fd)
        self._child_fds.clear()
        self._parent_fds.clear()
        with self._wake_lock:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    def _live_parents(self) -> list[int]:
        """The parents still running (a parent's pidfd turns readable when it exits)."""
        exited = multiprocessing.connection.wait(list(self._parent_fds.values()), timeout=0)
        return [parent for parent, fd in self._parent_fds.items() if fd not in exited]

    def _adopt_new_children(self, parents: list[int]) -> None:
        watched = {child for child, _, _ in self._child_fds.values()}
        for parent in parents:
            for child in children(parent):
                if child in watched or not self.picked(child):
                    continue
                with contextlib.suppress(ProcessLookupError):
                    title = process_title(child)
                    self._child_fds[os.pidfd_open(child)] = (child, parent, title)
                    logger.info("watching process %d (%s, child of %d)", child, title, parent)

    def _crashed(self, child: int, parent: int, title: str) -> bool:
        """``child`` exited: a crash when its parent is still running ``parent_grace`` later."""
        if multiprocessing.connection.wait([self._parent_fds[parent]], timeout=self.parent_grace):
            logger.info("process %d (%s) exited with its parent %d", child, title, parent)
            return False
        self.crashed = child
        self.on_crash(
            f"process {child} ({title}) exited while its parent {parent} "
            f"({process_title(parent)}) runs: the requests it held would wait for ever"
        )
        return True
