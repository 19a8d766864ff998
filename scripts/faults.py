#!/usr/bin/env python3
"""``make faults``: the fault table on this machine, written to ``docs/faults.md``.

Standard library only. Each row is one fault injected into one of the seeds' deployments while
a steady load of the seed's request shape (128 tokens in, 64 out, 4 at a time) flows through
Dynamo 1.6.1's frontend in KV router mode (``test-registered/overlay_harness/fault_rows.py``
says what each row does and measures). Columns, one after another, in the envs ``make
validate`` uses:

- ``stock``: SGLang 0.5.23 from PyPI with upstream's own ``--sidecar``, the overlay not
  loaded (where stock cannot run a row, the cell says what stock does instead);
- ``overlay``: the same env with the overlay's plugin;
- ``rebuilt``: SGLang 0.5.23 rebuilt with the patch series, the overlay not loaded.

Exit status 0 when every overlay cell meets its row's goal (``docs/faults.md``).

    scripts/faults.py --wheel-dir dist [--columns stock,overlay] [--rows a,b,c,d1,d2,e,f,g,h]
                      [--no-doc]
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from envs import ROOT, env_path, find_wheel, log
from validate import RELEASE, column_session, machine, versions

COLUMNS = ("stock", "overlay", "rebuilt")
DEFAULT_COLUMNS = ("stock", "overlay")
ROWS = ("a", "b", "c", "d1", "d2", "e", "f", "g", "h")
# Whose cells must meet the row's goal; the others are reported beside them.
JUDGED = ("overlay", "rebuilt")
DOC = ROOT / "docs" / "faults.md"
BEGIN, END = "<!-- make faults: begin -->", "<!-- make faults: end -->"
COMMAND = "make faults"
FAULTS = {
    "a": "a. a follower's relay sidecar SIGKILLed, `--sidecar-restart on-failure` (deployment 2)",
    "b": "b. the same, with the default policy `never` (deployment 2)",
    "c": "c. a leader's serving sidecar SIGKILLed, `on-failure`, the frontend's "
    "`--migration-limit 3` (deployment 1)",
    "d1": "d. a scheduler SIGKILLed while it serves: one engine's, the frontend's "
    "`--migration-limit 3` (deployment 1)",
    "d2": "d. a scheduler SIGKILLed while it serves: the follower's (deployment 2)",
    "e": "e. the orchestrator relaunches the whole group: every node stopped (SIGTERM), then "
    "started again (deployment 2)",
    "f": "f. SIGTERM to every node with requests in flight, SIGKILL after 30 s (deployment 2)",
    "g": "g. Dynamo's standalone router (a KV-event subscriber off the request path) "
    "SIGSTOPped for 3 s, then three times for 10 s, each time resumed (deployment 1)",
    "h": "h. a decode engine SIGKILLed with KV transfers in flight, then relaunched; the "
    "frontend's `--migration-limit 3` (deployment 3)",
}


def run_column(column: str, wheel: Path, rows: list[str], logs: Path) -> list[dict]:
    """The column's cells, its rows run in its env one after another."""
    session = column_session(column, wheel)
    environ = session.environ(None)
    with tempfile.TemporaryDirectory(prefix="overlay-faults-") as tmp:
        out = Path(tmp) / "cells.jsonl"
        command = [str(session.env / "bin" / "python"), "-m", "overlay_harness.fault_table",
                   "--column", column, "--out", str(out), "--rows", ",".join(rows),
                   "--keep-logs", str(logs)]  # fmt: skip
        log(f"faults: column {column}, rows {','.join(rows)}, in {session.env.name}")
        code = subprocess.run(command, env=environ, cwd=ROOT / "test-registered").returncode
        cells = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if code != 0 or len(cells) != len(rows):
        raise SystemExit(f"faults: column {column} ended with exit {code} after {len(cells)} of "
                         f"{len(rows)} rows")  # fmt: skip
    return cells


def seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def cell_text(cell: dict) -> str:
    """One cell: the verdict, the load's counts, the recovery times, what was left, the notes
    and the first error."""
    if not cell["sent"] and not cell["problems"]:
        return "<br>".join(cell["notes"]).replace("|", "/")
    verdict = "meets the goal" if not cell["problems"] else "misses: " + "; ".join(cell["problems"])
    parts = [f"**{verdict}**",
             f"{cell['sent']} sent, {cell['succeeded']} served, {cell['failed']} failed, "
             f"{cell['hung']} hung"]  # fmt: skip
    parts += [f"{name}: {seconds(value)}" for name, value in cell["recovery"].items()]
    if cell["left"] is not None:
        parts.append(f"processes left: {cell['left']}")
    parts += cell["notes"]
    if cell["first_error"]:
        parts.append(f"first error: `{cell['first_error'][:200]}`")
    return "<br>".join(str(part).replace("|", "/").replace("\n", " ") for part in parts)


NOT_RUN = "not run yet"


def table(cells: dict[tuple[str, str], dict], columns: list[str], rows: list[str]) -> str:
    header = ["fault", *columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        texts = [cell_text(cells[(row, c)]) if (row, c) in cells else NOT_RUN for c in columns]
        lines.append("| " + " | ".join([FAULTS[row], *texts]) + " |")
    return "\n".join(lines)


CELLS = "cells.json"


def merge_cells(path: Path, cells: dict[tuple[str, str], dict]) -> dict[tuple[str, str], dict]:
    """``cells`` over the cells saved at ``path`` by earlier runs; the merge is saved there."""
    saved = json.loads(path.read_text()) if path.exists() else []
    merged = {(cell["row"], cell["column"]): cell for cell in saved}
    merged.update({(row, column): {**cell, "column": column}
                   for (row, column), cell in cells.items()})  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(merged.values()), indent=1))
    return merged


def missed_goals(cells: dict[tuple[str, str], dict]) -> list[str]:
    """The judged columns' cells that miss their row's goal, one line each."""
    return [f"{column} row {row}: {'; '.join(cell['problems'])}"
            for (row, column), cell in sorted(cells.items())
            if column in JUDGED and cell["problems"]]  # fmt: skip


def write_doc(region: str) -> None:
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC} lacks the markers {BEGIN} / {END}")
    head, rest = doc.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{region}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel-dir", type=Path, default=ROOT / "dist")
    parser.add_argument("--columns", default=",".join(DEFAULT_COLUMNS))
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--logs", type=Path, default=ROOT / "faults-logs",
                        help="each row's logs, per column")  # fmt: skip
    parser.add_argument("--no-doc", action="store_true", help=f"do not write {DOC.name}")
    args = parser.parse_args(argv)
    columns = args.columns.split(",")
    rows = sorted(args.rows.split(","), key=lambda row: ROWS.index(row) if row in ROWS else 0)
    if unknown := set(columns) - set(COLUMNS):
        raise SystemExit(f"--columns: unknown {sorted(unknown)}; choose from {COLUMNS}")
    if unknown_rows := set(rows) - set(ROWS):
        raise SystemExit(f"--rows: unknown {sorted(unknown_rows)}; choose from {ROWS}")
    wheel = find_wheel(args.wheel_dir)
    started = time.monotonic()
    cells = {(cell["row"], column): cell for column in columns
             for cell in run_column(column, wheel, rows, args.logs)}  # fmt: skip
    minutes = (time.monotonic() - started) / 60
    # A run of some rows or columns keeps the other cells of the last runs (kept beside the logs).
    ran_rows, ran_columns = rows, columns
    cells = merge_cells(args.logs / CELLS, cells)
    columns = [column for column in COLUMNS if any(c == column for _, c in cells)]
    rows = [row for row in ROWS if any(r == row for r, _ in cells)]
    about = (f"Written by `{COMMAND}` on {datetime.date.today()}: {machine()}. Versions: "
             f"{versions(env_path(RELEASE))}. This run: rows {', '.join(ran_rows)} of "
             f"{', '.join(ran_columns)} in {minutes:.0f} min; any other cell is from an earlier "
             f"run, kept in `{CELLS}` beside the logs.")  # fmt: skip
    region = f"{about}\n\n{table(cells, columns, rows)}"
    print(region)
    if not args.no_doc:
        write_doc(region)
    missed = missed_goals(cells)
    for line in missed:
        log(f"faults: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
