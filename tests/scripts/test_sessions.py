"""``scripts/sessions.py``'s pool: the last job waits for a free slot with no session waiting,
runs beside the last session, and fails the pool when it fails; a job over twice its budget
fails the pool, named, and every job's time is recorded for ``make test``'s phase table (real
processes)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import phases
import pytest
import sessions


@pytest.fixture(autouse=True)
def private_phase_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs' times go to a table of this test's, never to the phase table of a ``make
    test`` these tests may be running inside."""
    monkeypatch.setenv(phases.PHASES_ENV, str(tmp_path / "phases.tsv"))


# A job notes (its name, "start"|"end", the time) in a shared file, creates ``make`` (or "-")
# as it starts, then waits for ``wait_for`` (or "-") to exist, with a deadline, and exits
# ``code``: the order the jobs really ran in is read back, and no sleep decides it.
_JOB = """
import json, os, sys, time
name, events, make, wait_for, code = sys.argv[1:6]
def note(what):
    with open(events, "a") as f:
        f.write(json.dumps([name, what, time.monotonic()]) + "\\n")
note("start")
note("share " + os.environ.get("SGLANG_OVERLAY_TEST_PORT_SHARE", "-"))
if make != "-":
    open(make, "w").close()
deadline = time.monotonic() + 60
while wait_for != "-" and not os.path.exists(wait_for) and time.monotonic() < deadline:
    time.sleep(0.02)
note("end")
sys.exit(int(code))
"""


def job(name: str, events: Path, *, make: Path | None = None, wait_for: Path | None = None,
        code: int = 0) -> sessions.LastJob:  # fmt: skip
    argv = [sys.executable, "-c", _JOB, name, str(events), str(make or "-"),
            str(wait_for or "-"), str(code)]  # fmt: skip
    return sessions.LastJob(name, argv)


def order(events: Path) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    return [(name, what) for name, what, _ in sorted(rows, key=lambda row: row[2])]


def long_short_then(tmp_path: Path, third: str) -> list[tuple[str, str]]:
    """Two slots: "long" runs until ``third`` has started, "short" ends at once; what the jobs
    noted, in the order they noted it."""
    events, released = tmp_path / "events", tmp_path / "released"
    pool = [
        job("long", events, wait_for=released),
        job("short", events),
        job(third, events, make=released),
    ]
    assert sessions.run_sessions(pool, 2) == []
    return order(events)


def test_the_last_job_starts_in_the_tail_beside_the_last_session(tmp_path: Path) -> None:
    # Run after the whole pool, "last" would find "long" ended by its deadline instead.
    ran = long_short_then(tmp_path, "last")
    assert ran.index(("short", "end")) < ran.index(("last", "start")) < ran.index(("long", "end"))


def test_a_failing_last_job_fails_the_pool(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    events = tmp_path / "events"
    pool = [job("session", events), job("last", events, code=3)]
    assert sessions.run_sessions(pool, 2) == ["last"]
    assert sessions.report(["last"], pool) == 1
    captured = capsys.readouterr()
    assert "failed on last" in captured.out + captured.err


def test_a_job_over_twice_its_budget_fails_the_pool_named(tmp_path: Path) -> None:
    events = tmp_path / "events"
    # No real process ends within two microseconds; an hour is never reached.
    slow = dataclasses.replace(job("slow", events), budget=1e-6)
    on_time = dataclasses.replace(job("on time", events), budget=3600)
    failed = sessions.run_sessions([slow, on_time], 2)
    assert failed == ["slow (over 2x its budget)"]
    recorded = {name: (status, note) for name, _, status, note in phases.read()}
    assert recorded["slow"] == (0, "budget 0 s: over 2x")
    assert recorded["on time"] == (0, "budget 3600 s")


def test_one_at_a_time_the_budget_is_checked_too(tmp_path: Path) -> None:
    slow = dataclasses.replace(job("slow", tmp_path / "events"), budget=1e-6)
    assert sessions.run_sessions([slow], 1) == ["slow (over 2x its budget)"]


def test_jobs_side_by_side_take_the_port_shares_of_their_slots(tmp_path: Path) -> None:
    # "third" starts in the slot "short" freed, while "long" holds the other.
    shares = {
        name: what.split()[1]
        for name, what in long_short_then(tmp_path, "third")
        if what.startswith("share")
    }
    assert {shares["long"], shares["short"]} == {"0/2", "1/2"}
    assert shares["third"] == shares["short"]
