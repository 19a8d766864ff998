"""One column of the fault table (``make faults``, ``scripts/faults.py``): each row's
deployment launched with what an operator sets for that fault (``deployments.Resilience``),
the fault injected under a steady load through Dynamo's frontend
(``overlay_harness.fault_rows``), and the cell written, one row after another (a deployment is
a large topology: they never start side by side).

Run inside one SGLang env, as ``python -m overlay_harness.fault_table --column COLUMN --out
FILE [--rows a,b,c,d1,d2,e,f,g,h] [--keep-logs DIR]``; the column is what the env and its
environment are (``overlay_harness.validation``'s columns). Nothing here asserts:
``scripts/faults.py`` compares the overlay's cells with their goals.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from overlay_harness import deployments, fault_rows, fault_rows_relaunch, fault_rows_stall, gate
from overlay_harness.deployments import Deployment, Resilience
from overlay_harness.validation import COLUMNS, failure_lines, record_rows

RowFunction = Callable[[Deployment, str], fault_rows.Cell]
MIGRATION_LIMIT = 3


@dataclasses.dataclass(frozen=True)
class Row:
    """A fault: the deployment it runs on, what the operator set, the injection and its
    measures, and what stock does instead where stock cannot run it."""

    deployment: int
    resilience: Resilience
    run: RowFunction
    stock_instead: str | None = None


NO_FOLLOWER_SIDECAR = ("not run: stock SGLang runs `--sidecar` on the leader only, so a follower "
                       "has no relay to fail, and rank 1's events never reach the router "
                       "(`docs/validation.md`, deployment 2)")  # fmt: skip
ROWS: dict[str, Row] = {
    "a": Row(2, Resilience("on-failure"),
             lambda d, c: fault_rows.follower_relay_killed(d, c, restarts=True),
             NO_FOLLOWER_SIDECAR),
    "b": Row(2, Resilience(), lambda d, c: fault_rows.follower_relay_killed(d, c, restarts=False),
             NO_FOLLOWER_SIDECAR),
    "c": Row(1, Resilience("on-failure", MIGRATION_LIMIT), fault_rows.serving_sidecar_killed),
    "d1": Row(1, Resilience("on-failure", MIGRATION_LIMIT),
              lambda d, c: fault_rows.scheduler_killed(d, c, node_index=0)),
    "d2": Row(2, Resilience("on-failure"),
              lambda d, c: fault_rows.scheduler_killed(d, c, node_index=1)),
    "e": Row(2, Resilience("on-failure"), fault_rows_relaunch.group_relaunched),
    "f": Row(2, Resilience("on-failure"), fault_rows.group_stopped),
    "g": Row(1, Resilience(), fault_rows_stall.consumer_stalled),
    "h": Row(3, Resilience("on-failure", MIGRATION_LIMIT), fault_rows_relaunch.decode_lost),
}  # fmt: skip


def run_row(name: str, column: str, workdir: Path) -> fault_rows.Cell:
    """Row ``name``'s deployment launched, the fault injected and measured, everything
    stopped; its cell (a launch or a check that broke names its error in the notes)."""
    row = ROWS[name]
    if column == "stock" and row.stock_instead:
        return fault_rows.Cell(name, column, "", notes=[row.stock_instead])
    _shape, launcher = deployments.SHAPES[row.deployment]
    cell = fault_rows.Cell(name, column, "")
    with contextlib.ExitStack() as stack:
        stack.enter_context(gate.large_launch(f"fault row {name}"))
        try:
            deployment = launcher(stack, workdir, resilience=row.resilience)
            cell = row.run(deployment, column)
        except Exception as error:  # the cell names it: a column may fail anywhere
            cell.problems.append(f"{type(error).__name__}: {str(error)[:300]} | "
                                 f"{failure_lines(sorted(workdir.glob('*.log')))}")  # fmt: skip
    return cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--column", choices=COLUMNS, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the cells, as JSON lines")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--keep-logs", type=Path, help="copy each row's logs here")
    args = parser.parse_args(argv)
    record_rows(args.rows.split(","), lambda name, workdir: run_row(name, args.column, workdir),
                args.out, args.keep_logs, f"{args.column}-row-", "faults")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
