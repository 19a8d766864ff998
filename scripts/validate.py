#!/usr/bin/env python3
"""``make validate``: the seeds' validation table on this machine, every column at the seed's
full shapes, written to ``docs/validation.md``.

Standard library only. Columns, one after another (each deployment is a large topology, and
they never start side by side):

- ``stock``: SGLang 0.5.23 from PyPI, the overlay not loaded;
- ``overlay``: the same env with the overlay's plugin;
- ``rebuilt``: SGLang 0.5.23 rebuilt with the patch series (``scripts/patches.py``), the
  overlay not loaded.

Each column runs ``overlay_harness.validation`` in its env (the four deployments, Dynamo in
front), once per consumer: Dynamo 1.6.1 (the SGLang env's own, every node's ``--sidecar``),
then each next version (``envs.NEXT_CONSUMERS``, from its own env, its sidecars started beside
the nodes). One table per consumer is printed and written between the markers of
``docs/validation.md``, with the machine, the versions and this command. Exit status 0 when
every cell is what its column must show: every deployment passes with the overlay and on the
rebuilt wheel, whoever is in front, and with 1.6.1 the stock column fails deployments 2, 3 and
4 as the seed's report did.

    scripts/validate.py --wheel-dir dist [--columns stock,overlay,rebuilt] [--rows 1,2,3,4]
        [--consumers 1.6.1,1.7.0.dev20261026]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dynamo_env import DEFAULT_VERSION as RELEASED_DYNAMO
from envs import (
    NEXT_CONSUMERS,
    ROOT,
    build_env,
    env_path,
    find_wheel,
    install_consumer,
    log,
    prepare_session_env,
)
from sessions import Session

import patches

RELEASE = patches.RELEASE
COLUMNS = ("stock", "overlay", "rebuilt")
ROWS = (1, 2, 3, 4)
CONSUMERS = (RELEASED_DYNAMO, *NEXT_CONSUMERS)
# What each column must show, per the issue and the seed: with the seed's Dynamo (1.6.1) in
# front the stock column fails where the seed's report failed (deployment 1 passed there, and
# may either way here); stock behind a next version is reported, not judged.
MUST_FAIL = {("stock", RELEASED_DYNAMO): {2, 3, 4}}
MUST_PASS = {(column, consumer): set(ROWS) for column in ("overlay", "rebuilt")
             for consumer in CONSUMERS}  # fmt: skip
DOC = ROOT / "docs" / "validation.md"
BEGIN, END = "<!-- make validate: begin -->", "<!-- make validate: end -->"
HEADING = "### Dynamo "
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


def run_column(column: str, consumer: str, wheel: Path, rows: list[int], logs: Path) -> list[dict]:
    """The column's cells with ``consumer`` in front, its deployments run in its env one after
    another."""
    session = column_session(column, wheel)
    environ = session.environ(None)
    with tempfile.TemporaryDirectory(prefix="overlay-validate-") as tmp:
        out = Path(tmp) / "cells.jsonl"
        command = [str(session.env / "bin" / "python"), "-m", "overlay_harness.validation",
                   "--column", column, "--out", str(out), "--rows", ",".join(map(str, rows)),
                   "--keep-logs", str(logs)]  # fmt: skip
        if consumer != RELEASED_DYNAMO:
            command += ["--consumer", consumer]
        log(f"validate: column {column}, Dynamo {consumer}, in {session.env.name}")
        code = subprocess.run(command, env=environ, cwd=ROOT / "test-registered").returncode
        cells = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if code != 0 or len(cells) != len(rows):
        raise SystemExit(f"validate: column {column} (Dynamo {consumer}) ended with exit {code} "
                         f"after {len(cells)} of {len(rows)} rows")  # fmt: skip
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


Cells = dict[tuple[int, str, str], dict]


def section(cells: Cells, columns: list[str], consumer: str, rows: list[int], about: str) -> str:
    """One consumer's section: its heading, ``about`` the run, and its table, a row per
    deployment and a column per side."""
    header = ["deployment", "the seed's result", *columns]
    if consumer != RELEASED_DYNAMO:
        about += (f" Dynamo {consumer} runs from an env of its own (`ai-dynamo` above is the "
                  "SGLang env's).")  # fmt: skip
    lines = [f"{HEADING}{consumer} in front", "", about, "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]  # fmt: skip
    for row in rows:
        shape = next(cells[(row, c, consumer)]["shape"] for c in columns)
        row_cells = [f"{row}. {shape}", SEED[row],
                     *(cell_text(cells[(row, c, consumer)]) for c in columns)]  # fmt: skip
        lines.append("| " + " | ".join(row_cells) + " |")
    return "\n".join(lines)


def unexpected(cells: Cells) -> list[str]:
    """The cells that are not what their column must show."""
    wrong = []
    for (row, column, consumer), cell in sorted(cells.items()):
        where = f"{column} row {row} (Dynamo {consumer})"
        if row in MUST_PASS.get((column, consumer), ()) and not cell["passed"]:
            wrong.append(f"{where} should pass: {cell['failure']}")
        if row in MUST_FAIL.get((column, consumer), ()) and cell["passed"]:
            wrong.append(f"{where} should fail as the seed's did, but passed")
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


def sections_by_consumer(text: str) -> dict[str, str]:
    """The sections of ``text`` (the doc's marked region), by consumer."""
    parts = re.split(rf"(?m)^(?={re.escape(HEADING)})", text)
    return {part[len(HEADING) :].split()[0]: part.strip() for part in parts
            if part.startswith(HEADING)}  # fmt: skip


def write_doc(sections: dict[str, str]) -> None:
    """``sections`` (by consumer) into the doc's marked region; the other consumers' sections
    there stay, so a run of one consumer keeps the other's table."""
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC} lacks the markers {BEGIN} / {END}")
    head, rest = doc.split(BEGIN, 1)
    region, tail = rest.split(END, 1)
    merged = {**sections_by_consumer(region), **sections}
    ordered = [merged[c] for c in CONSUMERS if c in merged]
    ordered += [text for consumer, text in merged.items() if consumer not in CONSUMERS]
    DOC.write_text(f"{head}{BEGIN}\n" + "\n\n".join(ordered) + f"\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel-dir", type=Path, default=ROOT / "dist")
    parser.add_argument("--columns", default=",".join(COLUMNS))
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--consumers", default=",".join(CONSUMERS),
                        help="the Dynamo versions in front, one table each")  # fmt: skip
    parser.add_argument("--logs", type=Path, default=ROOT / "validate-logs",
                        help="each deployment's logs, per column")  # fmt: skip
    parser.add_argument("--no-doc", action="store_true", help=f"do not write {DOC.name}")
    args = parser.parse_args(argv)
    wheel = find_wheel(args.wheel_dir)
    columns = args.columns.split(",")
    rows = [int(row) for row in args.rows.split(",")]
    consumers = args.consumers.split(",")
    if unknown_consumers := set(consumers) - set(CONSUMERS):
        raise SystemExit(f"--consumers: unknown {sorted(unknown_consumers)}; choose from "
                         f"{CONSUMERS}")  # fmt: skip
    if unknown := set(columns) - set(COLUMNS):
        raise SystemExit(f"--columns: unknown {sorted(unknown)}; choose from {COLUMNS}")
    if unknown_rows := set(rows) - set(ROWS):
        raise SystemExit(f"--rows: unknown {sorted(unknown_rows)}; choose from {ROWS}")
    started = time.monotonic()
    cells: Cells = {}
    for consumer in [c for c in CONSUMERS if c in consumers]:
        for column in columns:
            for cell in run_column(column, consumer, wheel, rows, args.logs):
                cells[(cell["row"], column, consumer)] = cell
    in_order = [column for column in COLUMNS if column in columns]
    minutes = (time.monotonic() - started) / 60
    about = (f"Written by `{COMMAND}` on {datetime.date.today()} in {minutes:.0f} min: "
             f"{machine()}. Versions: {versions(env_path(RELEASE))}; the "
             f"rebuilt wheel is {RELEASE} with `patches/sglang-{RELEASE}/` applied.")  # fmt: skip
    sections = {consumer: section(cells, in_order, consumer, rows, about)
                for consumer in CONSUMERS if consumer in consumers}  # fmt: skip
    print("\n\n".join(sections.values()))
    if not args.no_doc:
        write_doc(sections)
    wrong = unexpected(cells)
    for line in wrong:
        log(f"validate: {line}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
