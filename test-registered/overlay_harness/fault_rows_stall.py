"""The fault table's row g (``overlay_harness.fault_rows`` has the cell, the load and the
shared measures): a KV-event consumer off the request path, Dynamo's standalone router,
SIGSTOPped while the load runs, then resumed."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from overlay_harness import cpu_use, dynamo, fault_rows, kv_events, load, seed_checks
from overlay_harness.deployments import Deployment
from overlay_harness.fault_rows import Cell

# Row g: how long the oracle router stays stopped, the load's window before it, and how soon
# after the resume its scores must be right again. The throughput is compared over
# STALL_REPEATS pairs of windows (running, then stalled): one 10 s window on a 2-core machine
# whose four schedulers share the cores moves by about 10 % with no stall at all.
STALL = 10.0
STALL_REPEATS = 3
SCORES_RIGHT_AGAIN = 10.0
THROUGHPUT_KEPT = 0.9
ENGINE_ERROR = re.compile(r"Traceback|Scheduler hit an exception|SIGQUIT received")
# Dynamo's file discovery deletes a key its owner has not touched for 10 s (its etcd lease is
# as long), and the owner's keep-alive never writes a deleted key again: a process stopped for
# the whole STALL loses its registrations for good, the router's own endpoints among them. The
# scores are therefore also measured after a stall the lease survives.
DISCOVERY_LEASE = 10.0
SHORT_STALL = 3.0
REGISTRATION_LOST = "FileStore::keep_alive failed opening owned file"
Done = TypeVar("Done")


def _stalled(
    router: dynamo.Router, seconds: float, while_stopped: Callable[[], Done]
) -> tuple[float, float, Done]:
    """The router SIGSTOPped for ``seconds`` of load, then ``while_stopped()`` (after the
    window), then SIGCONT; (stopped at, the window's end, what ``while_stopped`` returned)."""
    stopped_at = time.monotonic()
    os.killpg(router.proc.pid, signal.SIGSTOP)
    try:
        threading.Event().wait(seconds)
        window_end = time.monotonic()
        done = while_stopped()
    finally:
        os.killpg(router.proc.pid, signal.SIGCONT)
    return stopped_at, window_end, done


def _pinned_prompt(frontend: dynamo.Frontend, target: seed_checks.Target) -> tuple[list[int], dict]:
    """A new prompt pinned to ``target`` through the frontend, in its own request; (the
    prompt, its reply)."""
    prompt = kv_events.prompt(seed_checks.INPUT_TOKENS)
    (reply,) = frontend.generate_many([prompt], 1, 1, dynamo.pin(target))
    return prompt, reply


def _scores_right(router: dynamo.Router, prompt: list[int], target: seed_checks.Target,
                  targets: list[seed_checks.Target]) -> float | None:  # fmt: skip
    """Seconds from now until ``router`` scores ``prompt`` on ``target`` alone; None past
    ``SCORES_RIGHT_AGAIN``."""
    began = time.monotonic()
    unseen = seed_checks.events_seen(router, prompt, (target,), targets, SCORES_RIGHT_AGAIN)
    return time.monotonic() - began if unseen is None else None


class StallWindows:
    """Pairs of equal windows of the steady load, running then stalled, with the CPU seconds
    each part of the deployment used in each."""

    def __init__(self, parts: dict[str, list[int]]):
        self.parts = parts
        self.stalls: list[tuple[float, float]] = []  # (stopped at, the window's end)
        self.cpu_running: list[dict[str, float]] = []
        self.cpu_stalled: list[dict[str, float]] = []

    def pair(self, router: dynamo.Router,
             while_stopped: Callable[[], Done] = lambda: None) -> Done:  # fmt: skip
        """``STALL`` seconds of load running, then ``STALL`` seconds with ``router`` stopped;
        what ``while_stopped`` returned."""
        began = cpu_use.sample(self.parts)
        threading.Event().wait(STALL)
        stopping = cpu_use.sample(self.parts)
        ended: dict[str, float] = {}

        def sample_then() -> Done:
            ended.update(cpu_use.sample(self.parts))
            return while_stopped()

        stopped_at, window_end, done = _stalled(router, STALL, sample_then)
        self.stalls.append((stopped_at, window_end))
        self.cpu_running.append(cpu_use.used_between(began, stopping))
        self.cpu_stalled.append(cpu_use.used_between(stopping, ended))
        return done

    def throughput(self, measured: load.Measured) -> tuple[list[float], list[float]]:
        """Tokens per second in each running window and in each stalled one after it."""
        running = [measured.token_rate(at - STALL, at) for at, _end in self.stalls]
        stalled = [measured.token_rate(at, end) for at, end in self.stalls]
        return running, stalled

    def cpu_seconds(self) -> str:
        return cpu_use.describe(cpu_use.summed(self.cpu_running), cpu_use.summed(self.cpu_stalled))


def consumer_stalled(deployment: Deployment, column: str) -> Cell:
    """Row g (deployment 1): Dynamo's standalone router, a KV-event subscriber off the request
    path, SIGSTOPped while the load runs, then resumed. First for ``SHORT_STALL`` seconds,
    under Dynamo's discovery lease: a prompt pinned during the stall is scored on its target
    within ``SCORES_RIGHT_AGAIN`` seconds of the resume. Then ``STALL_REPEATS`` times for
    ``STALL`` seconds, each after as long a running window: the engines' generated tokens per
    second over the stalls stay at least ``THROUGHPUT_KEPT`` of those over the windows before
    them, and after the first the scores are right again too, unless the router lost its
    discovery registrations (Dynamo's, named in the cell). No engine logs an error."""
    cell = Cell("g", column, f"the standalone router SIGSTOPped for {SHORT_STALL:.0f} s, "
                             f"then {STALL_REPEATS} times for {STALL:.0f} s")  # fmt: skip
    targets = seed_checks.registered_targets(deployment.router, deployment.targets)
    router, frontend = deployment.router, deployment.frontend
    logged = {node.name: len(node.log_text()) for node in deployment.nodes}
    with fault_rows.loaded(deployment, cell) as flow:
        router_logged = len(router.log_text())
        _at, _end, (prompt, short_reply) = _stalled(
            router, SHORT_STALL, lambda: _pinned_prompt(frontend, targets[0])
        )
        short = cell.recovery[f"scores right after {SHORT_STALL:.0f} s"] = _scores_right(
            router, prompt, targets[0], targets
        )
        lost_short = REGISTRATION_LOST in router.log_text()[router_logged:]
        router_logged = len(router.log_text())
        windows = StallWindows(cpu_use.parts_of(deployment))
        prompt, reply = windows.pair(router, lambda: _pinned_prompt(frontend, targets[1]))
        right = cell.recovery[f"scores right after {STALL:.0f} s"] = _scores_right(
            router, prompt, targets[1], targets
        )
        lost = REGISTRATION_LOST in router.log_text()[router_logged:]
        for _repeat in range(STALL_REPEATS - 1):
            windows.pair(router)
    running, stalled = windows.throughput(flow.measured())
    ratio = sum(stalled) / sum(running) if sum(running) else 0.0
    cell.notes.append(
        "tokens/s before → during each stall: "
        + ", ".join(f"{r:.1f} → {s:.1f}" for r, s in zip(running, stalled, strict=True))
        + f"; over the {STALL_REPEATS} stalls {ratio:.2f}×"
    )
    cell.notes.append("CPU seconds over the running windows → the stalls: " + windows.cpu_seconds())
    errors = [f"{node.name}: {line.strip()[:160]}" for node in deployment.nodes
              for line in node.log_text()[logged[node.name]:].splitlines()
              if ENGINE_ERROR.search(line)]  # fmt: skip
    cell.notes.append(
        f"pinned during the stalls: {'error' not in short_reply and 'error' not in reply}"
    )
    for stall, expired in ((SHORT_STALL, lost_short), (STALL, lost)):
        if expired:
            cell.notes.append(
                f"Dynamo: the stalled router's discovery registrations expired during the "
                f"{stall:.0f} s stall (its {DISCOVERY_LEASE:.0f} s lease, counted from its last "
                f"refresh) and were never written again (its log: '{REGISTRATION_LOST}'), so "
                f"nothing reaches it after the resume"
            )
    cell.expect(short is not None or lost_short, f"scores not right within "
                f"{SCORES_RIGHT_AGAIN:.0f} s of a {SHORT_STALL:.0f} s stall's end")  # fmt: skip
    cell.expect(ratio >= THROUGHPUT_KEPT, f"throughput during the stalls {ratio:.2f}× before")
    cell.expect(right is not None or lost,
                f"scores not right within {SCORES_RIGHT_AGAIN:.0f} s of the resume")  # fmt: skip
    cell.expect(not errors, f"engine errors: {errors[:2]}")
    cell.expect(cell.failed == 0, f"{cell.failed} failed: {cell.first_error}")
    cell.expect(cell.hung == 0, f"{cell.hung} hung")
    return cell
