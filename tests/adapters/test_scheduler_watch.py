"""Which processes the scheduler watch takes for a DP scheduler: real processes titled as
SGLang titles them (``PR_SET_NAME``), a parent and its child, killed at teardown."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from sglang_sidecar_overlay.adapters._scheduler_watch import is_dp_scheduler
from sglang_sidecar_overlay.sidecar.grandchild_watchdog import children, process_title

DEADLINE = 30.0
# A process titled argv[1] that starts one child titled argv[2], then sleeps.
TITLED = (
    "import ctypes, subprocess, sys, time\n"
    "ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n"
    'child = ("import ctypes, sys, time; "\n'
    '         "ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0); time.sleep(600)")\n'
    "subprocess.Popen([sys.executable, '-c', child, sys.argv[2]])\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def titled_pair() -> Iterator:
    made: list[subprocess.Popen[bytes]] = []

    def start(parent_title: str, child_title: str) -> int:
        parent = subprocess.Popen([sys.executable, "-c", TITLED, parent_title, child_title],
                                  start_new_session=True)  # fmt: skip
        made.append(parent)
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            kids = children(parent.pid)
            if kids and process_title(kids[0]) == child_title[:15]:
                return kids[0]
            time.sleep(0.02)
        raise AssertionError(f"no child titled {child_title!r} within {DEADLINE} s")

    yield start
    for parent in made:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_a_dp_controllers_scheduler_is_watched(titled_pair):
    child = titled_pair("sglang::data_parallel_controller", "sglang::scheduler_DP1_TP0")
    assert is_dp_scheduler(child)


def test_a_process_a_scheduler_forked_is_not(titled_pair):
    # A scheduler's fork keeps the scheduler's title until it execs: it is no scheduler.
    child = titled_pair("sglang::scheduler_DP0_TP0", "sglang::scheduler_DP0_TP0")
    assert not is_dp_scheduler(child)


def test_a_dp_controllers_other_child_is_not(titled_pair):
    child = titled_pair("sglang::data_parallel_controller", "python3")
    assert not is_dp_scheduler(child)
