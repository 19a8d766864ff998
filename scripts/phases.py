#!/usr/bin/env python3
"""Wall time per phase of ``make test``, printed at its end, so a slow run says where the time
went.

Standard library only. Each phase appends one line (name, seconds, exit status) to one file
(``$SGLANG_OVERLAY_PHASES``, default ``build/phases.tsv``); ``make test`` empties it first and
prints it last, whether the run passed or not. The test pool's sessions write their own lines
(``sessions.py``), so the table holds every session beside the phases around them.

    scripts/phases.py reset
    scripts/phases.py run NAME -- COMMAND...   # runs COMMAND, records its time, keeps its status
    scripts/phases.py report
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES_ENV = "SGLANG_OVERLAY_PHASES"


def phases_file() -> Path:
    return Path(os.environ.get(PHASES_ENV) or ROOT / "build" / "phases.tsv")


def record(name: str, seconds: float, status: int, note: str = "") -> None:
    """One phase's line; a name with a tab or a newline would break the table."""
    clean = " ".join(name.split())
    path = phases_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as sink:
        sink.write(f"{clean}\t{seconds:.0f}\t{status}\t{note}\n")


def read() -> list[tuple[str, int, int, str]]:
    path = phases_file()
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        name, seconds, status, note = [*line.split("\t"), ""][:4]
        rows.append((name, int(seconds), int(status), note))
    return rows


def table(rows: Sequence[tuple[str, int, int, str]]) -> str:
    if not rows:
        return "no phase recorded"
    width = max(len(name) for name, *_ in rows)
    lines = [f"{'phase'.ljust(width)}  {'seconds':>7}  result"]
    for name, seconds, status, note in rows:
        result = "ok" if status == 0 else f"exit {status}"
        lines.append(f"{name.ljust(width)}  {seconds:>7}  {result}{'  ' + note if note else ''}")
    return "\n".join(lines)


def run(name: str, command: Sequence[str]) -> int:
    started = time.monotonic()
    status = subprocess.run(list(command), check=False).returncode
    record(name, time.monotonic() - started, status)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("reset")
    commands.add_parser("report")
    timed = commands.add_parser("run")
    timed.add_argument("name")
    timed.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "reset":
        phases_file().unlink(missing_ok=True)
        return 0
    if args.command == "report":
        rows = read()
        failed = sum(1 for _, _, status, _ in rows if status != 0)
        print(f"== wall time per phase ({phases_file().name})\n{table(rows)}", flush=True)
        print(f"phases: {len(rows) - failed} passed, {failed} failed", flush=True)
        return 0
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        parser.error("run NAME -- COMMAND...: no command")
    return run(args.name, command)


if __name__ == "__main__":
    sys.exit(main())
