"""The fault table's row g (``overlay_harness.fault_rows`` has the cell, the load and the
shared measures): a KV-event consumer off the request path, Dynamo's standalone router,
SIGSTOPped while the load runs, then resumed."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

from overlay_harness import dynamo, fault_rows, kv_events, seed_checks
from overlay_harness.deployments import Deployment
from overlay_harness.fault_rows import Cell

# Row g: how long the oracle router stays stopped, the load's window before it, and how soon
# after the resume its scores must be right again.
STALL = 10.0
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


def _stalled(router: dynamo.Router, seconds: float, pinned: seed_checks.Target,
             frontend: dynamo.Frontend) -> tuple[float, float, list[int], dict]:  # fmt: skip
    """The router SIGSTOPped for ``seconds`` of load, then a prompt pinned to ``pinned`` (its
    own process, its own request, after the window), then SIGCONT; (stopped at, the window's
    end, the prompt, its reply)."""
    stopped_at = time.monotonic()
    os.killpg(router.proc.pid, signal.SIGSTOP)
    try:
        threading.Event().wait(seconds)
        window_end = time.monotonic()
        prompt = kv_events.prompt(seed_checks.INPUT_TOKENS)
        (reply,) = frontend.generate_many([prompt], 1, 1, dynamo.pin(pinned))
    finally:
        os.killpg(router.proc.pid, signal.SIGCONT)
    return stopped_at, window_end, prompt, reply


def _scores_right(router: dynamo.Router, prompt: list[int], target: seed_checks.Target,
                  targets: list[seed_checks.Target]) -> float | None:  # fmt: skip
    """Seconds from now until ``router`` scores ``prompt`` on ``target`` alone; None past
    ``SCORES_RIGHT_AGAIN``."""
    began = time.monotonic()
    unseen = seed_checks.events_seen(router, prompt, (target,), targets, SCORES_RIGHT_AGAIN)
    return time.monotonic() - began if unseen is None else None


def consumer_stalled(deployment: Deployment, column: str) -> Cell:
    """Row g (deployment 1): Dynamo's standalone router, a KV-event subscriber off the request
    path, SIGSTOPped while the load runs, then resumed. First for ``SHORT_STALL`` seconds,
    under Dynamo's discovery lease: a prompt pinned during the stall is scored on its target
    within ``SCORES_RIGHT_AGAIN`` seconds of the resume. Then for ``STALL`` seconds: the
    engines' generated tokens per second over the stall stay at least ``THROUGHPUT_KEPT`` of
    the ``STALL`` seconds before it, and the scores are right again after it too, unless the
    router lost its discovery registrations (Dynamo's, named in the cell). No engine logs an
    error."""
    cell = Cell("g", column, f"the standalone router SIGSTOPped for {SHORT_STALL:.0f} s, "
                             f"then for {STALL:.0f} s")  # fmt: skip
    targets = seed_checks.registered_targets(deployment.router, deployment.targets)
    router, frontend = deployment.router, deployment.frontend
    logged = {node.name: len(node.log_text()) for node in deployment.nodes}
    with fault_rows.loaded(deployment, cell) as flow:
        router_logged = len(router.log_text())
        _at, _end, prompt, short_reply = _stalled(router, SHORT_STALL, targets[0], frontend)
        short = cell.recovery[f"scores right after {SHORT_STALL:.0f} s"] = _scores_right(
            router, prompt, targets[0], targets
        )
        lost_short = REGISTRATION_LOST in router.log_text()[router_logged:]
        # A whole window of steady load after the short stall, to compare the stall with.
        threading.Event().wait(STALL)
        router_logged = len(router.log_text())
        stopped_at, window_end, prompt, reply = _stalled(router, STALL, targets[1], frontend)
        right = cell.recovery[f"scores right after {STALL:.0f} s"] = _scores_right(
            router, prompt, targets[1], targets
        )
    measured = flow.measured()
    before = measured.token_rate(stopped_at - STALL, stopped_at)
    during = measured.token_rate(stopped_at, window_end)
    ratio = during / before if before else 0.0
    cell.notes.append(f"tokens/s before {before:.1f}, during the stall {during:.1f} ({ratio:.2f}×)")
    errors = [f"{node.name}: {line.strip()[:160]}" for node in deployment.nodes
              for line in node.log_text()[logged[node.name]:].splitlines()
              if ENGINE_ERROR.search(line)]  # fmt: skip
    lost = REGISTRATION_LOST in router.log_text()[router_logged:]
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
    cell.expect(ratio >= THROUGHPUT_KEPT, f"throughput during the stall {ratio:.2f}× before")
    cell.expect(right is not None or lost,
                f"scores not right within {SCORES_RIGHT_AGAIN:.0f} s of the resume")  # fmt: skip
    cell.expect(not errors, f"engine errors: {errors[:2]}")
    cell.expect(cell.failed == 0, f"{cell.failed} failed: {cell.first_error}")
    cell.expect(cell.hung == 0, f"{cell.hung} hung")
    return cell
