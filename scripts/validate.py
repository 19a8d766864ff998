#!/usr/bin/env python3
"""``make validate``: the seeds' validation table on this machine, every column at the seed's
full shapes, written to ``docs/validation.md``.

Standard library only. Columns, one after another (each deployment is a large topology, and
they never start side by side):

- ``stock``: SGLang 0.5.23 from PyPI, the overlay not loaded;
- ``overlay``: the same env with the overlay's plugin;
- ``rebuilt``: SGLang 0.5.23 rebuilt with the patch series (``scripts/patches.py``), the
  overlay not loaded.

Each column runs ``overlay_harness.validation`` in its env (the four deployments, Dynamo
1.6.1's sidecar on every node and its frontend in front). The table is printed and written
between the markers of ``docs/validation.md``, with the machine, the versions and this command.
Exit status 0 when every cell is what its column must show: every deployment passes with the
overlay and on the rebuilt wheel, and the stock column fails deployments 2, 3 and 4 as the
seed's report did.

    scripts/validate.py --wheel-dir dist [--columns stock,overlay,rebuilt] [--rows 1,2,3,4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from envs import ROOT, build_env, env_path, find_wheel, install_consumer, log, prepare_session_env
from sessions import Session

import patches

RELEASE = patches.RELEASE
COLUMNS = ("stock", "overlay", "rebuilt")
ROWS = (1, 2, 3, 4)
# What each column must show, per the issue and the seed: the stock column fails where the
# seed's report failed (deployment 1 passed there, and may either way here).
MUST_FAIL = {"stock": {2, 3, 4}}
MUST_PASS = {"overlay": set(ROWS), "rebuilt": set(ROWS)}
DOC = ROOT / "docs" / "validation.md"
BEGIN, END = "<!-- make validate: begin -->", "<!-- make validate: end -->"
COMMAND = "make validate"
SEED = {
    1: "PASS",
    2: "FAIL: follower sidecar rejects rank 1",
    3: "FAIL: 16/40, prefill DP1 requests fail",
    4: "FAIL before serving",
}


def column_session(column: str, wheel: Path) -> Session:
    """The env and environment a column's deployments run in."""
    if column == "rebuilt":
        return patches.patched_session([RELEASE], wheel, [])
    env = build_env(RELEASE)
    install_consumer(env)
    prepare_session_env(env, wheel)
    extra = {patches.TEST_PLUGINS_ENV: patches.NO_PLUGIN} if column == "stock" else {}
    return Session(f"{RELEASE} ({column})", env, [], extra)


def run_column(column: str, wheel: Path, rows: list[int], logs: Path) -> list[dict]:
    """The column's cells, its deployments run in its env one after another."""
    session = column_session(column, wheel)
    environ = session.environ(None)
    environ["PYTHONPATH"] = str(ROOT / "test-registered")
    with tempfile.TemporaryDirectory(prefix="overlay-validate-") as tmp:
        out = Path(tmp) / "cells.jsonl"
        command = [str(session.env / "bin" / "python"), "-m", "overlay_harness.validation",
                   "--column", column, "--out", str(out), "--rows", ",".join(map(str, rows)),
                   "--keep-logs", str(logs)]  # fmt: skip
        log(f"validate: column {column} in {session.env.name}")
        code = subprocess.run(command, env=environ, cwd=ROOT / "test-registered").returncode
        cells = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if code != 0 or len(cells) != len(rows):
        raise SystemExit(f"validate: column {column} ended with exit {code} after {len(cells)} "
                         f"of {len(rows)} rows")  # fmt: skip
    return cells


def verdict(cell: dict) -> str:
    return "PASS" if cell["passed"] else "FAIL"


def cell_text(cell: dict) -> str:
    """One cell: the verdict, then the seed's measures, then what failed."""
    parts = [f"**{verdict(cell)}**", f"launch: {cell['launch']}", f"benchmark {cell['benchmark']}",
             f"targeted {cell['targeted']}", f"event targets {cell['events']}"]  # fmt: skip
    if cell["transfers"] != "–":
        parts.append(f"transfers: {cell['transfers']}")
    if cell["hit_rate"] != "–":
        parts.append(f"2nd-pass hit rate {cell['hit_rate']}")
    if cell["failure"]:
        parts.append(f"first failure: {cell['failure']}")
    return "<br>".join(part.replace("|", "/") for part in parts)


def table(cells: dict[tuple[int, str], dict], columns: list[str], rows: list[int]) -> str:
    header = ["deployment", "the seed's result", *columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        shape = next(cells[(row, c)]["shape"] for c in columns)
        row_cells = [f"{row}. {shape}", SEED[row], *(cell_text(cells[(row, c)]) for c in columns)]
        lines.append("| " + " | ".join(row_cells) + " |")
    return "\n".join(lines)


def unexpected(cells: dict[tuple[int, str], dict]) -> list[str]:
    """The cells that are not what their column must show."""
    wrong = []
    for (row, column), cell in sorted(cells.items()):
        if row in MUST_PASS.get(column, ()) and not cell["passed"]:
            wrong.append(f"{column} row {row} should pass: {cell['failure']}")
        if row in MUST_FAIL.get(column, ()) and cell["passed"]:
            wrong.append(f"{column} row {row} should fail as the seed's did, but passed")
    return wrong


def versions(env: Path) -> str:
    """The versions of what the columns run, as ``env`` (the stock and overlay one) has them."""
    python = env / "bin" / "python"
    code = ("import importlib.metadata as m\n"
            "for name in ('sglang', 'sglang-sidecar-overlay', 'ai-dynamo', "
            "'mooncake-transfer-engine-non-cuda', 'torch'):\n"
            "    try: print(f'{name} {m.version(name)}')\n"
            "    except m.PackageNotFoundError: pass\n")  # fmt: skip
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return ", ".join(out.stdout.split("\n")[:-1])


def machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    system = f"{platform.system()} {platform.machine()}"
    return f"{os.cpu_count()} cores, {memory:.0f} GiB, {system}, no GPU"


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC} lacks the markers {BEGIN} / {END}")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel-dir", type=Path, default=ROOT / "dist")
    parser.add_argument("--columns", default=",".join(COLUMNS))
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--logs", type=Path, default=ROOT / "validate-logs",
                        help="each deployment's logs, per column")  # fmt: skip
    parser.add_argument("--no-doc", action="store_true", help=f"do not write {DOC.name}")
    args = parser.parse_args(argv)
    wheel = find_wheel(args.wheel_dir)
    columns = args.columns.split(",")
    rows = [int(row) for row in args.rows.split(",")]
    if unknown := set(columns) - set(COLUMNS):
        raise SystemExit(f"--columns: unknown {sorted(unknown)}; choose from {COLUMNS}")
    if unknown_rows := set(rows) - set(ROWS):
        raise SystemExit(f"--rows: unknown {sorted(unknown_rows)}; choose from {ROWS}")
    started = time.monotonic()
    cells = {}
    for column in columns:
        for cell in run_column(column, wheel, rows, args.logs):
            cells[(cell["row"], column)] = cell
    text = table(cells, [column for column in COLUMNS if column in columns], rows)
    minutes = (time.monotonic() - started) / 60
    about = (f"Written by `{COMMAND}` on {datetime.date.today()} in {minutes:.0f} min: "
             f"{machine()}. Versions: {versions(env_path(RELEASE))}; the "
             f"rebuilt wheel is {RELEASE} with `patches/{RELEASE}/` applied.")  # fmt: skip
    print(f"{about}\n\n{text}")
    if not args.no_doc:
        write_doc(f"{about}\n\n{text}")
    wrong = unexpected(cells)
    for line in wrong:
        log(f"validate: {line}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
