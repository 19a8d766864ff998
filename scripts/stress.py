#!/usr/bin/env python3
"""Run the unit tier and one SGLang release session several times under a CPU hog.

Proves the suite does not depend on how it was started or on a quiet machine: every run is
started the way a CI wrapper's background job starts it (SIGINT ignored, stdin from /dev/null,
no controlling terminal), while a hog keeps every core busy at the tests' own priority. The hog
is ``stress-ng --cpu N`` when it is on PATH, else N spinning Python processes; the check starts
it before the first run and stops it after the last, also when a run fails or the check is
interrupted. Both stop by themselves after ``--hog-limit`` seconds, so nothing spins forever.

    python scripts/stress.py                       # 3 unit runs, then 3 sessions of the newest
    python scripts/stress.py --rounds 1 --release 0.5.21 --skip-unit

Needs the project's wheel in dist/ (``make install``); ``make stress`` does both. Each run's
output goes to ``--log-dir``; the summary prints pytest's last line per run and the load
average seen at its end. Exit status 0 only when every run passed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from envs import RELEASES

ROOT = Path(__file__).resolve().parent.parent
SPIN = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


@dataclass(frozen=True)
class Run:
    name: str
    command: list[str]


@dataclass(frozen=True)
class Outcome:
    name: str
    returncode: int
    seconds: float
    summary: str
    load: str


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each kind")
    parser.add_argument(
        "--release", default=RELEASES.NEWEST_RELEASE, help="the SGLang release session"
    )
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="hog workers")
    parser.add_argument("--hog-limit", type=float, default=4 * 3600.0, help="hog's own stop, s")
    parser.add_argument("--wheel-dir", type=Path, default=ROOT / "dist")
    parser.add_argument("--log-dir", type=Path, default=ROOT / "build" / "stress")
    parser.add_argument("--skip-unit", action="store_true")
    parser.add_argument("--skip-session", action="store_true")
    return parser


def planned_runs(args: argparse.Namespace, python: str) -> list[Run]:
    """The unit tier's runs first (minutes each), then the session's (tens of minutes)."""
    unit = [python, "-m", "pytest", "tests"]
    session = [
        python,
        str(ROOT / "scripts" / "sglang_envs.py"),
        "test",
        "--releases",
        args.release,
        "--jobs",
        "1",
        "--wheel-dir",
        str(args.wheel_dir),
    ]
    runs: list[Run] = []
    if not args.skip_unit:
        runs += [Run(f"unit-{i}", unit) for i in range(1, args.rounds + 1)]
    if not args.skip_session:
        runs += [Run(f"sglang-{args.release}-{i}", session) for i in range(1, args.rounds + 1)]
    return runs


def hog_command(cores: int, limit: float) -> list[list[str]]:
    """One stress-ng process for every core, or one spinning Python process per core."""
    stress_ng = shutil.which("stress-ng")
    if stress_ng:
        return [[stress_ng, "--cpu", str(cores), "--timeout", f"{int(limit)}s", "--quiet"]]
    return [[sys.executable, "-c", SPIN.format(limit=limit)] for _ in range(cores)]


@contextmanager
def cpu_hog(cores: int, limit: float) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Keep every core busy for the block; its process groups are killed when it ends."""
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for command in hog_command(cores, limit):
            workers.append(subprocess.Popen(command, start_new_session=True))
        yield workers
    finally:
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


def started_like_a_background_job() -> None:
    """A CI wrapper's job: SIGINT ignored (inherited across exec), its own session."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def last_summary_line(log: Path) -> str:
    """pytest's closing line (``== N passed in Xs ==``), or the log's last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("=") and (" passed" in line or " failed" in line or " error" in line):
            return line.strip("= ")
    return lines[-1] if lines else "(no output)"


def run_once(run: Run, log_dir: Path) -> Outcome:
    log = log_dir / f"{run.name}.log"
    started = time.monotonic()
    with log.open("wb") as out:
        returncode = subprocess.call(
            run.command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=started_like_a_background_job,
        )
    seconds = time.monotonic() - started
    load = Path("/proc/loadavg").read_text().split()[0]
    return Outcome(run.name, returncode, seconds, last_summary_line(log), load)


def report(outcomes: Sequence[Outcome], hog: str) -> None:
    print(f"\nstress: hog {hog}")
    print(f"{'run':<20} {'exit':>4} {'seconds':>8} {'load':>5}  pytest")
    for o in outcomes:
        print(f"{o.name:<20} {o.returncode:>4} {o.seconds:>8.0f} {o.load:>5}  {o.summary}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runs = planned_runs(args, str(ROOT / ".venv" / "bin" / "python"))
    if not runs:
        print("stress: nothing to run (both --skip-unit and --skip-session)", file=sys.stderr)
        return 2
    args.log_dir.mkdir(parents=True, exist_ok=True)
    hog = " ".join(hog_command(args.cores, args.hog_limit)[0][:3])
    outcomes: list[Outcome] = []
    with cpu_hog(args.cores, args.hog_limit):
        for run in runs:
            print(f"stress: {run.name} ...", flush=True)
            outcomes.append(run_once(run, args.log_dir))
            print(f"stress: {run.name} exit {outcomes[-1].returncode}", flush=True)
    report(outcomes, hog)
    return 0 if all(o.returncode == 0 for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
