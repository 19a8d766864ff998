"""Figures for the ``--sidecar`` supervisor (not part of the test suite).

Prints spawn-to-main latency, crash-detection latency (median and max of N, for an exit code and
for a signal), and stop time for a cooperative and for a SIGTERM-ignoring sidecar.

    python scripts/bench_sidecar.py [--runs 20] [--shutdown-timeout 2]

with the package and ``tests/`` importable: ``bench.sidecar`` (``make benchmark``) runs it so
(``dev_paths.child_environ``).

``--impl upstream`` measures SGLang's own launcher instead (``Sidecar`` + ``SubprocessWatchdog``
from ``sglang.srt.entrypoints.sidecar``, 1 s poll), so it must run under a Python that has SGLang
installed; the same provider children are used for both. ``--only KIND`` runs one measurement and
``--json`` prints the raw seconds, which is how ``scripts/bench`` interleaves the two.

Uses the provider fixtures in ``tests/sidecar_providers`` (hence ``tests`` importable: the
sidecar children import them, and both supervisors hand them this process's path). Times are
``time.monotonic()``, which is system-wide on Linux, so the provider's stamps compare directly
with the supervisor's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENDPOINT = "http://127.0.0.1:30001"
KINDS = ("spawn", "exit3", "segv", "stop-cooperative", "stop-ignore-term")


def _wait_report(path: Path, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no report at {path}")
        time.sleep(0.001)
    return json.loads(path.read_text())


class _Ours:
    """This project's supervisor; a crash is reported through its ``fatal`` callback."""

    def __init__(self, module: str, report: Path, timeout: float, fatal: Callable[[], None]):
        from sglang_sidecar_overlay.sidecar.supervisor import SidecarOptions, SidecarSupervisor

        self._sup = SidecarSupervisor(
            f"sidecar_providers.{module}",
            ENDPOINT,
            ["--report", str(report)],
            SidecarOptions(timeout),
            lambda description: fatal(),
        )

    def start(self) -> None:
        self._sup.start()

    def stop(self) -> None:
        self._sup.stop()


class _Upstream:
    """SGLang's launcher, built the way ``start_sidecar()`` builds it, minus the server args.

    Its watchdog reports a crash by sending SIGQUIT to this process; the handler stands in for
    the server's, which would tear the process tree down.
    """

    def __init__(self, module: str, report: Path, timeout: float, fatal: Callable[[], None]):
        import multiprocessing as mp

        from sglang.srt.entrypoints import sidecar as upstream

        name = f"sidecar_providers.{module}"
        proc = mp.get_context("spawn").Process(
            name=f"sglang_sidecar_{name}",
            target=upstream._run_sidecar,
            args=(name, ["--report", str(report)], ENDPOINT),
        )
        self._sidecar = upstream.Sidecar(proc, name, shutdown_timeout=timeout)
        signal.signal(signal.SIGQUIT, lambda signum, frame: fatal())

    def start(self) -> None:
        self._sidecar.start()

    def stop(self) -> None:
        self._sidecar.stop()
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


IMPLS: dict[str, Any] = {"ours": _Ours, "upstream": _Upstream}


def _wait_event(event: threading.Event, timeout: float) -> bool:
    # Short sleeps keep the main thread ready to run a signal handler at once.
    deadline = time.monotonic() + timeout
    while not event.is_set():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def spawn_to_main(impl: Any, workdir: Path, runs: int) -> list[float]:
    out = []
    for i in range(runs):
        report = workdir / f"spawn{i}.json"
        sup = impl("serve", report, 5.0, lambda: None)
        t0 = time.monotonic()
        sup.start()
        out.append(_wait_report(report)["time"] - t0)
        sup.stop()
    return out


def detection(impl: Any, workdir: Path, module: str, runs: int) -> list[float]:
    out = []
    for i in range(runs):
        report = workdir / f"{module}{i}.json"
        done = threading.Event()
        stamp: list[float] = []

        def fatal(stamp=stamp, done=done) -> None:
            if not done.is_set():
                stamp.append(time.monotonic())
                done.set()

        sup = impl(module, report, 5.0, fatal)
        sup.start()
        if not _wait_event(done, 60):
            raise TimeoutError(f"{module}: exit not reported")
        out.append(stamp[0] - _wait_report(report)["time"])
        sup.stop()
    return out


def stop_time(impl: Any, workdir: Path, module: str, runs: int, timeout: float) -> list[float]:
    out = []
    for i in range(runs):
        report = workdir / f"stop-{module}{i}.json"
        sup = impl(module, report, timeout, lambda: None)
        sup.start()
        _wait_report(report)
        t0 = time.monotonic()
        sup.stop()
        out.append(time.monotonic() - t0)
    return out


def measure(impl_name: str, kind: str, workdir: Path, runs: int, timeout: float) -> list[float]:
    impl = IMPLS[impl_name]
    if kind == "spawn":
        return spawn_to_main(impl, workdir, runs)
    if kind in ("exit3", "segv"):
        return detection(impl, workdir, kind, runs)
    if kind == "stop-cooperative":
        return stop_time(impl, workdir, "serve", runs, 45.0)
    if kind == "stop-ignore-term":
        return stop_time(impl, workdir, "ignore_term", runs, timeout)
    raise ValueError(f"unknown measurement {kind!r}; choose from {', '.join(KINDS)}")


LABELS = {
    "spawn": "spawn -> provider main()",
    "exit3": "crash detection, exit code 3",
    "segv": "crash detection, SIGSEGV",
    "stop-cooperative": "stop, cooperative child",
    "stop-ignore-term": "stop, SIGTERM-ignoring child (timeout {t:g} s)",
}


def _row(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"{name:<44} n={len(ms):<3} median={statistics.median(ms):8.1f} ms  max={max(ms):8.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=sorted(IMPLS), default="ours")
    parser.add_argument("--only", choices=KINDS, help="run one measurement")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--stop-runs", type=int, default=5)
    parser.add_argument("--shutdown-timeout", type=float, default=2.0)
    parser.add_argument("--json", action="store_true", help="print {kind: [seconds...]}")
    parser.add_argument("--verbose", action="store_true", help="show the supervisor's log")
    args = parser.parse_args()
    if importlib.util.find_spec("sidecar_providers") is None:
        sys.exit("tests/sidecar_providers is not importable: run it as bench.sidecar does")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.CRITICAL)
    kinds = [args.only] if args.only else list(KINDS)
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sidecar-") as tmp:
        for kind in kinds:
            runs = args.stop_runs if kind.startswith("stop") else args.runs
            values = measure(args.impl, kind, Path(tmp), runs, args.shutdown_timeout)
            results[kind] = values
            if not args.json:
                print(_row(LABELS[kind].format(t=args.shutdown_timeout), values), flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
