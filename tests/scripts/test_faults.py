"""``scripts/faults.py``'s table: what a cell says, which cells fail the run, and the doc's
marked region."""

from __future__ import annotations

from pathlib import Path

import faults
import pytest


def cell(**fields) -> dict:
    base = {"row": "a", "column": "overlay", "fault": "", "sent": 20, "succeeded": 20,
            "failed": 0, "hung": 0, "first_error": None, "recovery": {}, "left": None,
            "notes": [], "problems": []}  # fmt: skip
    return {**base, **fields}


def test_a_cell_that_meets_its_goal_shows_counts_and_recovery() -> None:
    text = faults.cell_text(cell(recovery={"relay back": 1.27, "rank 1 scored": None}, left=0))
    parts = text.split("<br>")
    assert parts[0] == "**meets the goal**"
    assert parts[1] == "20 sent, 20 served, 0 failed, 0 hung"
    assert "relay back: 1.3 s" in parts and "rank 1 scored: never" in parts
    assert "processes left: 0" in parts


def test_a_miss_is_named_and_the_first_error_kept_out_of_the_table_syntax() -> None:
    text = faults.cell_text(cell(failed=2, succeeded=18, problems=["2 failed: a|b"],
                                 first_error="503 a|b\nmore"))  # fmt: skip
    assert text.startswith("**misses: 2 failed: a/b**")
    assert "|" not in text and "\n" not in text
    assert "first error: `503 a/b more`" in text


def test_a_row_stock_cannot_run_says_what_stock_does_instead() -> None:
    text = faults.cell_text(cell(column="stock", sent=0, succeeded=0, notes=["not run: why"]))
    assert text == "not run: why"


def test_only_the_judged_columns_fail_the_run() -> None:
    cells = {("a", "stock"): cell(column="stock", problems=["engine back never"]),
             ("a", "overlay"): cell(),
             ("c", "overlay"): cell(row="c", problems=["1 failed: x", "1 hung"])}  # fmt: skip
    assert faults.missed_goals(cells) == ["overlay row c: 1 failed: x; 1 hung"]


def test_the_table_has_a_row_per_fault_and_a_column_per_side() -> None:
    cells = {(row, column): cell(row=row, column=column) for row in ("a", "c")
             for column in ("stock", "overlay")}  # fmt: skip
    lines = faults.table(cells, ["stock", "overlay"], ["a", "c"]).splitlines()
    assert lines[0] == "| fault | stock | overlay |"
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        f"| {faults.FAULTS['a']}", f"| {faults.FAULTS['c']}"]  # fmt: skip


def test_the_doc_region_is_replaced_and_markers_are_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "faults.md"
    monkeypatch.setattr(faults, "DOC", doc)
    doc.write_text(f"# T\n\nbefore\n\n{faults.BEGIN}\nold table\n{faults.END}\n\nafter\n")
    faults.write_doc("new table")
    assert doc.read_text() == f"# T\n\nbefore\n\n{faults.BEGIN}\nnew table\n{faults.END}\n\nafter\n"
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match="lacks the markers"):
        faults.write_doc("x")


def test_a_run_of_some_rows_keeps_the_other_cells(tmp_path: Path) -> None:
    saved = tmp_path / "logs" / faults.CELLS
    faults.merge_cells(saved, {("a", "overlay"): cell(), ("c", "overlay"): cell(row="c")})
    merged = faults.merge_cells(saved, {("c", "overlay"): cell(row="c", failed=1)})
    assert sorted(merged) == [("a", "overlay"), ("c", "overlay")]
    assert merged[("c", "overlay")]["failed"] == 1
    assert faults.merge_cells(saved, {}) == merged


def test_a_cell_no_run_has_made_yet_says_so() -> None:
    lines = faults.table({("a", "overlay"): cell()}, ["stock", "overlay"], ["a"]).splitlines()
    assert lines[2].split(" | ")[1] == faults.NOT_RUN
