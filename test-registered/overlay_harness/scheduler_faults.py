"""Faults injected into SGLang's real scheduler process, for the fault tests.

A node started with ``FAULT_ENV`` set passes ``run_faulty_scheduler`` as SGLang's own
``run_scheduler_process_func`` (the parameter ``Engine`` and ``launch_server`` take for other
scheduler backends), which runs the release's real ``run_scheduler_process`` around the fault:

- ``kill_at_start``: the scheduler process is SIGKILLed as it starts, before it reports ready
  (so before any rendezvous: a follower needs no leader to show it);
- ``kill_after_ready``: the real scheduler initialises, then is SIGKILLed with its ready message
  on the way: the message reaches the engine only once the scheduler is dead, so the engine
  takes a dead scheduler for a ready one;
- ``shared_kv_endpoint``: on a follower (``--node-rank >= 1``) SGLang's per-rank endpoint
  offset (``ZmqEventPublisher.offset_endpoint_port``) is dropped, so with an ``ipc://``
  kv-events endpoint every publisher of the node binds the same path (libzmq replaces the
  socket file) and reports it: a misconfigured node whose ranks claim one address. SGLang
  never does this on its own. The publishers are created one at a time (a lock beside the
  path): libzmq unlinks the old file and then binds, and two ranks binding in the same
  instant raced between the two, the second failing with ``Address already in use``.
"""

from __future__ import annotations

import fcntl
import inspect
import json
import os
import select
import signal
from typing import Any

FAULT_ENV = "OVERLAY_HARNESS_SCHEDULER_FAULT"
FAULTS = ("kill_at_start", "kill_after_ready", "shared_kv_endpoint")


def requested_fault() -> str | None:
    """The fault this node's schedulers get, None for none; an unknown name is an error."""
    fault = os.environ.get(FAULT_ENV) or None
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"{FAULT_ENV}={fault!r}: expected one of {FAULTS}")
    return fault


def scheduler_function() -> Any:
    """What the node passes as ``run_scheduler_process_func``: None (SGLang's default) unless
    a fault is requested."""
    return run_faulty_scheduler if requested_fault() else None


def run_faulty_scheduler(*args: Any, **kwargs: Any) -> None:
    """Same arguments as the installed release's ``run_scheduler_process``."""
    from sglang.srt.managers import scheduler

    fault = requested_fault()
    if fault == "kill_at_start":
        os.kill(os.getpid(), signal.SIGKILL)
    bound = inspect.signature(scheduler.run_scheduler_process).bind(*args, **kwargs)
    if fault == "shared_kv_endpoint" and (bound.arguments["server_args"].node_rank or 0) >= 1:
        from sglang.srt.disaggregation.kv_events import ZmqEventPublisher

        ZmqEventPublisher.offset_endpoint_port = staticmethod(lambda endpoint, rank: endpoint)
        _create_publishers_one_at_a_time(ZmqEventPublisher, bound.arguments["server_args"])
    if fault == "kill_after_ready":
        bound.arguments["pipe_writer"] = _ReadyAfterDeath(bound.arguments["pipe_writer"])
    scheduler.run_scheduler_process(*bound.args, **bound.kwargs)


def _create_publishers_one_at_a_time(publisher_class: Any, server_args: Any) -> None:
    """Serialize the node's publishers' creation (their binds) with a lock beside the ipc path."""
    endpoint = json.loads(server_args.kv_events_config or "{}").get("endpoint", "")
    if not endpoint.startswith("ipc://"):
        return
    lock_path = endpoint[len("ipc://") :] + ".lock"
    create = publisher_class.__init__

    def create_alone(self: Any, *args: Any, **kwargs: Any) -> None:
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            create(self, *args, **kwargs)

    publisher_class.__init__ = create_alone


# How long the forked messenger waits for the killed scheduler to become a zombie.
DEATH_DEADLINE = 60.0


def _wait_until_dead(pid: int, seconds: float) -> None:
    """Until ``pid`` has exited as its parent's ``waitpid`` sees it (or ``seconds`` pass): its
    whole thread group gone. A pidfd polls readable only then; ``/proc/<pid>/stat`` shows the
    leader a zombie while its other threads still exit, and on a loaded machine the engine's
    ``is_alive()`` then still found the scheduler alive."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:  # already exited and reaped
        return
    try:
        select.select([pidfd], [], [], seconds)
    finally:
        os.close(pidfd)


class _ReadyAfterDeath:
    """The scheduler's ready pipe, whose first message is delivered only after the scheduler
    is dead: a forked child sees EOF on a pipe only the scheduler writes to, waits until the
    scheduler's exit is final (its files close before that: on a loaded machine the engine
    could otherwise still see it alive), and sends it; the scheduler SIGKILLs itself."""

    def __init__(self, pipe_writer: Any) -> None:
        self._pipe_writer = pipe_writer

    def send(self, message: Any) -> None:
        death_r, death_w = os.pipe()
        scheduler = os.getpid()
        if os.fork() == 0:
            os.close(death_w)
            os.read(death_r, 1)
            _wait_until_dead(scheduler, DEATH_DEADLINE)
            self._pipe_writer.send(message)
            os._exit(0)
        os.close(death_r)
        os.kill(scheduler, signal.SIGKILL)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe_writer, name)
