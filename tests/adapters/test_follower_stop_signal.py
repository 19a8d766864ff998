"""A follower's stop signals: a scheduler ended by SIGTERM waits for the node's own SIGTERM (an
orchestrator signalling every process of the node at once) before it counts as a crash, and
the node's SIGTERM stops its metadata server first even behind a handler SGLang installed
later. Real signals to this process, whose handlers stand in for SGLang's."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sglang_sidecar_overlay.adapters._follower import (
    STOP_SIGNALS,
    failing_on_scheduler_crash,
    stop_server_before_signals,
    wait_for_own_stop_signal,
)
from sglang_sidecar_overlay.adapters._node_launch import LaunchPlan, NodeLaunch
from sglang_sidecar_overlay.contract.incarnation import Incarnation
from sglang_sidecar_overlay.server.follower import start_follower_server

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


# A handler SGLang installs after the follower's server started (0.5.23's follower waits for
# the leader's shutdown broadcast on SIGTERM): the wait on the schedulers puts the server's
# stop back in front of it. Real signals to this process, a real follower server, a real
# scheduler process that ends when the stand-in handler "broadcasts" the shutdown.


@pytest.fixture
def scheduler_until_shutdown() -> Iterator[tuple[multiprocessing.Process, Any]]:
    context = multiprocessing.get_context("spawn")
    shutdown = context.Event()
    proc = context.Process(target=shutdown.wait, args=(DEADLINE,), daemon=True)
    proc.start()
    try:
        yield proc, shutdown
    finally:
        shutdown.set()
        proc.join(DEADLINE)
        if proc.exitcode is None:
            proc.kill()
            proc.join(DEADLINE)


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def follower_launch(proc: multiprocessing.Process) -> tuple[NodeLaunch, list[str]]:
    """A follower's launch with a real metadata server watching ``proc``; the order in which
    the server's stop and the stand-in SGLang handler ran goes to the returned list."""
    launch = NodeLaunch(Incarnation.new(), LaunchPlan((), ()), follower=True, legacy_dp_size=False)
    launch.procs = [proc]
    server = start_follower_server("127.0.0.1", 0, "{}", [proc.pid])
    order: list[str] = []
    server.add_before_stop(lambda: order.append("server stopping"))
    stop_server_before_signals(server)
    launch.follower_server = server
    return launch, order


def sigterm_to_self_once_chained_again(server: Any) -> threading.Thread:
    """SIGTERM to this process as soon as the server's stop is the SIGTERM handler again."""

    def send() -> None:
        deadline = time.monotonic() + DEADLINE
        while getattr(signal.getsignal(signal.SIGTERM), "stops_first", None) is not server:
            assert time.monotonic() < deadline, "the server's stop was never chained again"
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender


def test_sigterm_stops_the_server_before_a_handler_sglang_installed_later(
    scheduler_until_shutdown, restored_handlers
):
    proc, shutdown = scheduler_until_shutdown
    launch, order = follower_launch(proc)

    def waits_for_the_leaders_broadcast(signum: int, frame: object) -> None:
        order.append("SGLang's handler")
        shutdown.set()  # the broadcast: the scheduler ends with code 0

    try:
        signal.signal(signal.SIGTERM, waits_for_the_leaders_broadcast)
        sender = sigterm_to_self_once_chained_again(launch.follower_server)
        failing_on_scheduler_crash(lambda: None, launch)()
        sender.join()
    finally:
        launch.follower_server.stop()
    assert order == ["server stopping", "SGLang's handler"]
    assert proc.exitcode == 0
    # Once forwarded, SGLang's handler is the process's again: a second SIGTERM only logs.
    assert signal.getsignal(signal.SIGTERM) is waits_for_the_leaders_broadcast


def test_chaining_twice_stops_the_server_once_per_signal(restored_handlers):
    server = start_follower_server("127.0.0.1", 0, "{}", [os.getpid()])
    stops: list[str] = []
    server.add_before_stop(lambda: stops.append("stop"))
    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        stop_server_before_signals(server)
        chained = signal.getsignal(signal.SIGTERM)
        stop_server_before_signals(server)
        assert signal.getsignal(signal.SIGTERM) is chained
    finally:
        server.stop()
    assert stops == ["stop"]
