"""Figures for the ``--sidecar`` supervisor (not part of the test suite).

Prints spawn-to-main latency, crash-detection latency (median and max of N, for an exit code and
for a signal), and stop time for a cooperative and for a SIGTERM-ignoring sidecar.

    PYTHONPATH=python python scripts/bench_sidecar.py [--runs 20] [--shutdown-timeout 2]

Uses the provider fixtures in ``tests/sidecar_providers``. Times are ``time.monotonic()``, which
is system-wide on Linux, so the provider's stamps compare directly with the supervisor's.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from sglang_sidecar_overlay.sidecar import SidecarOptions, SidecarSupervisor

ENDPOINT = "http://127.0.0.1:30001"


def _wait_report(path: Path, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no report at {path}")
        time.sleep(0.001)
    return json.loads(path.read_text())


def _supervisor(module: str, report: Path, options: SidecarOptions, fatal) -> SidecarSupervisor:
    return SidecarSupervisor(
        f"sidecar_providers.{module}", ENDPOINT, ["--report", str(report)], options, fatal
    )


def spawn_to_main(workdir: Path, runs: int) -> list[float]:
    out = []
    for i in range(runs):
        report = workdir / f"spawn{i}.json"
        sup = _supervisor("serve", report, SidecarOptions(5.0), lambda d: None)
        t0 = time.monotonic()
        sup.start()
        out.append(_wait_report(report)["time"] - t0)
        sup.stop()
    return out


def detection(workdir: Path, module: str, runs: int) -> list[float]:
    out = []
    for i in range(runs):
        report = workdir / f"{module}{i}.json"
        done = threading.Event()
        stamp: list[float] = []

        def fatal(description: str, stamp=stamp, done=done) -> None:
            stamp.append(time.monotonic())
            done.set()

        sup = _supervisor(module, report, SidecarOptions(5.0), fatal)
        sup.start()
        if not done.wait(30):
            raise TimeoutError(f"{module}: exit not reported")
        out.append(stamp[0] - _wait_report(report)["time"])
        sup.stop()
    return out


def stop_time(workdir: Path, module: str, runs: int, timeout: float) -> list[float]:
    out = []
    for i in range(runs):
        report = workdir / f"stop-{module}{i}.json"
        sup = _supervisor(module, report, SidecarOptions(timeout), lambda d: None)
        sup.start()
        _wait_report(report)
        t0 = time.monotonic()
        sup.stop()
        out.append(time.monotonic() - t0)
    return out


def _row(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"{name:<44} n={len(ms):<3} median={statistics.median(ms):8.1f} ms  max={max(ms):8.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--stop-runs", type=int, default=5)
    parser.add_argument("--shutdown-timeout", type=float, default=2.0)
    parser.add_argument("--verbose", action="store_true", help="show the supervisor's log")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="bench-sidecar-") as tmp:
        workdir = Path(tmp)
        print(_row("spawn -> provider main()", spawn_to_main(workdir, args.runs)))
        print(_row("crash detection, exit code 3", detection(workdir, "exit3", args.runs)))
        print(_row("crash detection, SIGSEGV", detection(workdir, "segv", args.runs)))
        print(_row("stop, cooperative child", stop_time(workdir, "serve", args.stop_runs, 45.0)))
        t = args.shutdown_timeout
        ignoring = stop_time(workdir, "ignore_term", args.stop_runs, t)
        print(_row(f"stop, SIGTERM-ignoring child (timeout {t:g} s)", ignoring))


if __name__ == "__main__":
    main()
