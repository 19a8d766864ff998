"""Running a harness function on a node's host.

A node of a multi-node group is its own host (``overlay_harness.netns``), reachable only from
inside it, so the test process asks it through this module: ``run(host, function, *args)``
runs ``python -m overlay_harness.inside MODULE FUNCTION ARGS_JSON`` in the host's namespace
(``ip netns exec``) and returns the function's JSON result; ``Stream`` does the same for a
generator function and reads its items as they come (a Watch stream, a live subscription).
With ``host`` None (a single-node group on the test's own host) ``run`` calls the function in
this process, and ``Stream`` runs it in a subprocess here.

Run as a module, it is the runner: the result is one ``{"result": ...}`` line on stdout, a
generator's items one ``{"item": ...}`` line each, an exception one ``{"raised": ...}`` line
and exit 1.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import selectors
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from overlay_harness import netns

HARNESS_ROOT = Path(__file__).resolve().parent.parent
RUN_DEADLINE = 300.0


def harness_environ() -> dict[str, str]:
    """This process's environment for a harness child. The harness needs no ``PYTHONPATH``:
    a child runs ``python -m overlay_harness.…`` from :data:`HARNESS_ROOT` (``-m`` puts it
    first on the path), and what it spawns inherits that path (``multiprocessing``, the
    sidecar supervisor)."""
    return dict(os.environ)


def _argv(function: Callable[..., Any], args: tuple, python: str | None = None) -> list[str]:
    module = function.__module__
    return [python or sys.executable, "-m", "overlay_harness.inside", module, function.__name__,
            json.dumps(list(args))]  # fmt: skip


def run(
    host: netns.Host | None,
    function: Callable[..., Any],
    *args: Any,
    python: str | None = None,
    environ: dict[str, str] | None = None,
    deadline: float = RUN_DEADLINE,
) -> Any:
    """``function(*args)`` (a module-level function with JSON arguments and result) on
    ``host``; an exception there is raised here as an ``AssertionError`` naming the host.

    ``python`` runs it with another interpreter (another consumer version's env), and
    ``environ`` in place of this process's environment; either way in a process of its own,
    killed after ``deadline`` seconds.
    """
    if host is None and python is None and environ is None:
        return function(*args)
    argv = _argv(function, args, python)
    proc = subprocess.run(
        host.command(argv) if host is not None else argv,
        capture_output=True,
        text=True,
        timeout=deadline,
        env=dict(environ or os.environ),
        cwd=HARNESS_ROOT,
        stdin=subprocess.DEVNULL,
    )
    lines = proc.stdout.splitlines()
    record = json.loads(lines[-1]) if lines else {}
    if "result" not in record:
        raise AssertionError(
            f"{function.__name__}{args} inside {host}: "
            f"{record.get('raised') or proc.stderr[-2000:]}"
        )
    return record["result"]


class Stream:
    """A generator function's items, produced on ``host`` and read here as they come.

    The generator may read its stdin (for instance to hold a port until told to let go);
    ``close()`` closes that stdin, then kills the runner.
    """

    def __init__(self, host: netns.Host | None, function: Callable[..., Any], *args: Any):
        argv = _argv(function, args)
        self.proc = subprocess.Popen(
            host.command(argv) if host is not None else argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=harness_environ(),
            cwd=HARNESS_ROOT,
        )
        self.what = f"{function.__name__}{args} on {host or 'this host'}"

    def next_item(self, timeout: float = 120.0) -> Any:
        """The next item; raises when the stream ends or nothing comes within ``timeout``."""
        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not selector.select(timeout):
                raise AssertionError(f"{self.what}: nothing within {timeout:.0f} s")
        finally:
            selector.close()
        line = self.proc.stdout.readline()
        record = json.loads(line) if line else {}
        if "item" not in record:
            raise AssertionError(f"{self.what} ended: {record or self.proc.stderr.read()[-2000:]}")
        return record["item"]

    def end_input(self) -> None:
        """Close the generator's stdin (it may read it to know when to stop), nothing more."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()

    def close(self) -> None:
        self.end_input()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.proc.stderr.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    module, function, args = argv
    target = getattr(importlib.import_module(module), function)
    try:
        result = target(*json.loads(args))
        if inspect.isgenerator(result):
            for item in result:
                _emit({"item": item})
            return 0
        _emit({"result": result})
    except Exception as exc:  # reported to the test, which raises it there
        _emit({"raised": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
