"""``scripts/phases.py``: a phase keeps its command's exit status, and the report lists every
phase in order and closes with the passed and failed counts (real processes)."""

from __future__ import annotations

import sys
from pathlib import Path

import phases
import pytest


def test_a_phase_keeps_its_status_and_the_report_counts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv(phases.PHASES_ENV, str(tmp_path / "phases.tsv"))
    assert phases.main(["run", "fine", "--", sys.executable, "-c", "pass"]) == 0
    assert phases.main(["run", "broken step", "--", sys.executable, "-c", "exit(3)"]) == 3
    assert phases.main(["report"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:4]] == ["fine", "broken"]
    assert lines[3].endswith("exit 3")
    assert lines[-1] == "phases: 1 passed, 1 failed"
    assert phases.main(["reset"]) == 0
    assert phases.read() == []
