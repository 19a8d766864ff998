"""The scripts' tests record their jobs' times in a file of their own, never in the phase table
of a ``make test`` they may be running inside."""

from __future__ import annotations

from pathlib import Path

import phases
import pytest


@pytest.fixture(autouse=True)
def private_phase_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(phases.PHASES_ENV, str(tmp_path / "phases.tsv"))
