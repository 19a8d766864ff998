"""A follower's scheduler ended by SIGTERM waits for the node's own SIGTERM (an orchestrator
signalling every process of the node at once) before it counts as a crash: real signals to
this process, whose handler stands in for the follower's (it ends the wait)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest
from sglang_sidecar_overlay.adapters._follower import wait_for_own_stop_signal

DEADLINE = 30.0


class NodeStopped(Exception):
    """What the stand-in handler raises: the node's own SIGTERM arrived."""


@pytest.fixture
def sigterm_stops_the_node() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise NodeStopped

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def sigterm_to_self_soon() -> threading.Timer:
    timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    return timer


def test_a_scheduler_sigtermed_waits_for_the_nodes_own_sigterm(sigterm_stops_the_node):
    timer = sigterm_to_self_soon()
    with pytest.raises(NodeStopped):
        wait_for_own_stop_signal(-signal.SIGTERM, grace=DEADLINE)
    timer.join()


def test_a_scheduler_sigtermed_alone_is_a_crash_once_the_grace_passed(sigterm_stops_the_node):
    wait_for_own_stop_signal(-signal.SIGTERM, grace=0.05)  # returns: the caller fails the node


@pytest.mark.parametrize("exitcode", [-signal.SIGKILL, -signal.SIGSEGV, 1])
def test_any_other_end_is_a_crash_at_once(sigterm_stops_the_node, exitcode):
    # A grace this long would outlast the test run: returning at all shows nothing waited.
    wait_for_own_stop_signal(exitcode, grace=10 * 3600)
