"""The grandchild watchdog with real processes: a parent (a DP controller's stand-in, a
``python -c`` child of the test) spawns children titled like schedulers; the test kills them
with real signals. Every process started here is SIGKILLed at teardown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from sglang_sidecar_overlay.sidecar import proctree
from sglang_sidecar_overlay.sidecar.grandchild_watchdog import (
    GrandchildWatchdog,
    process_title,
)

DEADLINE = 30.0
TITLE = "watched-child"

# The parent: spawns one titled child per line it reads on stdin ("sleeper" for an untitled
# one), prints each child's pid, and lives until its stdin closes or it is killed.
PARENT = r"""
import subprocess, sys
TITLED = (  # PR_SET_NAME: the title the kernel keeps in /proc/PID/comm
    "import ctypes, sys, time; "
    "ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0); time.sleep(600)"
)
kids = []
for line in sys.stdin:
    title = line.strip()
    argv = [sys.executable, "-c", TITLED, title] if title != "sleeper" else ["sleep", "600"]
    kids.append(subprocess.Popen(argv))
    print(kids[-1].pid, flush=True)
"""


class Parent:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PARENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def spawn(self, title: str = TITLE) -> int:
        """A new child of the parent, once it carries its title."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(title + "\n")
        self.proc.stdin.flush()
        child = int(self.proc.stdout.readline())
        if title != "sleeper":
            wait_until(lambda: process_title(child) == title, "the child's title")
        return child

    def kill_tree(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate()  # reaps it and closes its pipes


def wait_until(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {DEADLINE} s")
        time.sleep(0.02)


class Crashes:
    """The ``on_crash`` callback: what it was told, and an event to wait on."""

    def __init__(self) -> None:
        self.told: list[str] = []
        self.event = threading.Event()

    def __call__(self, description: str) -> None:
        self.told.append(description)
        self.event.set()


@pytest.fixture
def parent() -> Iterator[Parent]:
    made = Parent()
    yield made
    made.kill_tree()


@pytest.fixture
def watch() -> Iterator[Callable[..., tuple[GrandchildWatchdog, Crashes]]]:
    made: list[GrandchildWatchdog] = []

    def start(parents: list[int], **options: float) -> tuple[GrandchildWatchdog, Crashes]:
        crashes = Crashes()
        watchdog = GrandchildWatchdog(
            parents, lambda pid: process_title(pid) == TITLE, crashes, rescan=0.1, **options
        )
        watchdog.start()
        made.append(watchdog)
        return watchdog, crashes

    yield start
    for watchdog in made:
        watchdog.stop()


def watching(watchdog: GrandchildWatchdog, child: int) -> Callable[[], bool]:
    return lambda: child in {pid for pid, _, _ in list(watchdog._child_fds.values())}


def test_a_child_killed_while_its_parent_runs_is_a_crash(parent, watch):
    child = parent.spawn()
    watchdog, crashes = watch([parent.pid])
    wait_until(watching(watchdog, child), "the child watched")
    os.kill(child, signal.SIGKILL)
    assert crashes.event.wait(DEADLINE)
    assert len(crashes.told) == 1 and f"process {child} ({TITLE})" in crashes.told[0]
    assert f"parent {parent.pid}" in crashes.told[0]
    assert watchdog.crashed == child


def test_a_child_spawned_after_the_start_is_watched_too(parent, watch):
    watchdog, crashes = watch([parent.pid])
    child = parent.spawn()
    wait_until(watching(watchdog, child), "the late child watched")
    os.kill(child, signal.SIGKILL)
    assert crashes.event.wait(DEADLINE)
    assert watchdog.crashed == child


def test_a_child_the_predicate_does_not_pick_is_left_alone(parent, watch):
    picked = parent.spawn()
    other = parent.spawn("sleeper")
    watchdog, crashes = watch([parent.pid])
    wait_until(watching(watchdog, picked), "the picked child watched")
    assert not watching(watchdog, other)()
    os.kill(other, signal.SIGKILL)
    wait_until(lambda: proctree.read_stat(other).state == "Z", "the other child dead")
    assert not crashes.event.is_set()
    os.kill(picked, signal.SIGKILL)
    assert crashes.event.wait(DEADLINE) and watchdog.crashed == picked


def test_a_teardown_of_parent_and_child_is_no_crash(parent, watch):
    child = parent.spawn()
    watchdog, crashes = watch([parent.pid], parent_grace=5.0)
    wait_until(watching(watchdog, child), "the child watched")
    parent.kill_tree()
    assert watchdog._thread is not None
    watchdog._thread.join(DEADLINE)
    assert not watchdog._thread.is_alive(), "the watchdog outlived every parent"
    assert not crashes.event.is_set() and watchdog.crashed is None


def test_stop_ends_the_thread_and_closes_its_descriptors(parent, watch):
    child = parent.spawn()
    before = set(os.listdir("/proc/self/fd"))
    watchdog, crashes = watch([parent.pid])
    wait_until(watching(watchdog, child), "the child watched")
    watchdog.stop()
    assert watchdog._thread is not None and not watchdog._thread.is_alive()
    assert set(os.listdir("/proc/self/fd")) <= before
    os.kill(child, signal.SIGKILL)  # the thread is gone: nothing is told
    assert not crashes.told


def test_a_stop_after_the_thread_ended_writes_to_no_reused_descriptor(watch):
    watchdog, _crashes = watch([2**22 + 1])  # no parent: the thread ends at once
    assert watchdog._thread is not None
    watchdog._thread.join(DEADLINE)
    read_end, write_end = os.pipe()  # likely the numbers the watchdog's pipe had
    try:
        watchdog.stop()
        os.set_blocking(read_end, False)
        with pytest.raises(BlockingIOError):
            os.read(read_end, 1)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_watchdog_stopped_before_it_started_closes_its_pipe():
    before = set(os.listdir("/proc/self/fd"))
    GrandchildWatchdog([os.getpid()], lambda pid: True, Crashes()).stop()
    assert set(os.listdir("/proc/self/fd")) <= before


def test_a_parent_already_gone_is_skipped(watch):
    watchdog, crashes = watch([2**22 + 1])  # above pid_max's default: no such process
    assert watchdog._thread is not None
    watchdog._thread.join(DEADLINE)
    assert not watchdog._thread.is_alive() and not crashes.told
