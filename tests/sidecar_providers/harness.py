"""Test-side helpers for the sidecar tests: deadline waits, reports, cleanup of what ran, and a
SIGTERM handler that stops a supervisor first (what a host process without SGLang's own
SIGTERM handling would install)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sglang_sidecar_overlay.sidecar import proctree
from sglang_sidecar_overlay.sidecar.supervisor import SidecarOptions, SidecarSupervisor

ProcKey = tuple[int, int]


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.005) -> bool:
    """Poll ``predicate`` until it is truthy or ``timeout`` passes; return the last result."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(interval)


def read_report(path: str | Path, timeout: float = 20.0) -> dict:
    """Wait for a provider's report file and return it."""
    path = Path(path)
    assert wait_for(path.exists, timeout), f"no report at {path} within {timeout} s"
    return json.loads(path.read_text())


def read_log(path: str | Path) -> list[dict]:
    log = Path(str(path) + ".log")
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def proc_key(pid: int) -> ProcKey | None:
    stat = proctree.read_stat(pid)
    return None if stat is None else (pid, stat.starttime)


def gone(key: ProcKey) -> bool:
    """True once the process has exited (a zombie nobody reaped counts as exited)."""
    return not proctree.is_running(key)


def kill_all(keys: list[ProcKey]) -> None:
    """Last-resort cleanup for a failed test: SIGKILL every listed process still running."""
    proctree.signal_processes([k for k in keys if not gone(k)], signal.SIGKILL)


def tree_of(pid: int) -> list[ProcKey]:
    key = proc_key(pid)
    return ([key] if key else []) + proctree.descendants(pid)


def env_with_paths(*paths: str | os.PathLike) -> dict[str, str]:
    """os.environ with ``paths`` importable first, for helper scripts run in a child."""
    # scripts/ is on the unit tier's path (pyproject.toml); imported here, where it is needed:
    # the sidecar children import this module too.
    from dev_paths import child_environ

    return child_environ(*paths)


class Fatal:
    """An ``on_fatal`` recorder."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.times: list[float] = []
        self.event = threading.Event()

    def __call__(self, description: str) -> None:
        self.times.append(time.monotonic())
        self.calls.append(description)
        self.event.set()


# The default shutdown timeout of the supervisors built here. A cooperative provider exits as
# soon as its SIGTERM handler has run, so a passing test never waits this long; it is generous
# because on a loaded machine (a CI box installing several GB beside the unit tests) even
# writing the handler's small file has taken over 5 s.
COOPERATIVE_GRACE = 60.0


class Supervisors:
    """Builds supervisors for ``sidecar_providers.<module>``; ``close()`` stops them all and
    SIGKILLs anything they started that is still running."""

    def __init__(self) -> None:
        self.made: list[SidecarSupervisor] = []
        self.extra: list[ProcKey] = []

    def make(
        self, module: str, args: list[str], options: SidecarOptions | None = None, **kw: Any
    ) -> tuple[SidecarSupervisor, Fatal]:
        fatal = Fatal()
        sup = SidecarSupervisor(
            f"sidecar_providers.{module}",
            "http://127.0.0.1:30001",
            args,
            options or SidecarOptions(shutdown_timeout=COOPERATIVE_GRACE),
            fatal,
            **kw,
        )
        self.made.append(sup)
        return sup, fatal

    def close(self) -> None:
        for sup in self.made:
            if sup.pid is not None:
                self.extra.extend(tree_of(sup.pid))
            sup.stop()
        kill_all(self.extra)


def install_sigterm_stop(stop: Callable[[], None]) -> Callable[[], None]:
    """Make SIGTERM run ``stop()`` first, then the handler it replaced (or the default action).

    Only from the main thread (Python's rule for signal handlers); elsewhere this does nothing.
    Returns a function that puts the previous handler back (if ours is still current).
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: object) -> None:
        stop()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        elif os.getpid() == 1:
            # PID 1 ignores default-action signals inside its namespace: exit explicitly.
            raise SystemExit(128 + signum)
        else:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, handler)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, previous)

    return restore


@contextlib.contextmanager
def running_sidecar(supervisor: SidecarSupervisor) -> Iterator[SidecarSupervisor]:
    """Scope a sidecar's life: start, stop on SIGTERM (main thread only), always stop on exit."""
    restore = install_sigterm_stop(supervisor.stop)
    try:
        supervisor.start()
        yield supervisor
    finally:
        supervisor.stop()
        restore()
