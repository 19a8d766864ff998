"""pytest sessions of ``test-registered/`` in cached SGLang environments, side by side.

Standard library only. A :class:`Session` is one pytest run in one env (``envs.py``);
:func:`run_sessions` runs a list of them, up to ``jobs`` at once: a session spends most of its
time in one process importing SGLang, so on two cores two sessions take little longer than
one. Side by side, each session's output goes to a file, printed whole when it ends, and the
sessions pick test ports from disjoint shares of the port range.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pd_transfer
import phases
from envs import NEXT_CONSUMERS_ENV, ROOT, log, next_consumer_pythons

# Sessions run side by side pick test ports from disjoint shares of the port range
# (test-registered/overlay_harness/ports.py reads it): "<index>/<count>".
PORT_SHARE_ENV = "SGLANG_OVERLAY_TEST_PORT_SHARE"
HEARTBEAT_SECONDS = 120.0
# A job that takes more than this many times its budget fails the pool, named: drift shows as
# a red run long before the pool reaches CI's wall.
OVER_BUDGET_FACTOR = 2.0


def names_paths(pytest_args: Sequence[str]) -> bool:
    """Whether the pytest arguments name test paths (which replace the default ones)."""
    return any(not arg.startswith("-") for arg in pytest_args)


@dataclasses.dataclass
class Session:
    """One pytest run of ``test-registered/`` in one env."""

    label: str
    env: Path
    pytest_args: Sequence[str]
    extra_env: dict[str, str] = dataclasses.field(default_factory=dict)
    # Seconds it should take in make test's pool on the 2-core machine (None: unchecked).
    budget: float | None = None

    def command(self) -> list[str]:
        # Paths given after "--" replace the default of the whole tree.
        targets = [] if names_paths(self.pytest_args) else [ROOT / "test-registered"]
        cmd = [
            self.env / "bin" / "python",
            "-m",
            "pytest",
            "-c",
            ROOT / "test-registered" / "pytest.ini",
            "--rootdir",
            ROOT / "test-registered",
            *targets,
            *self.pytest_args,
        ]
        return [str(part) for part in cmd]

    def environ(self, port_share: str | None) -> dict[str, str]:
        environ = dict(os.environ)
        environ.pop("VIRTUAL_ENV", None)
        # The project is tested as installed: the source tree must not shadow the wheel.
        environ.pop("PYTHONPATH", None)
        environ[NEXT_CONSUMERS_ENV] = json.dumps(next_consumer_pythons())
        environ.update(self.extra_env)
        # As an activated env: its tools (ninja) on PATH; JIT-built extensions kept per env,
        # since every release's torch would otherwise share one build directory.
        environ["PATH"] = f"{self.env / 'bin'}{os.pathsep}{environ.get('PATH', '')}"
        environ["TORCH_EXTENSIONS_DIR"] = str(self.env / "torch-extensions")
        # Mooncake's system libraries, for the nodes of the disaggregation tests.
        environ.update(pd_transfer.session_environ(self.env))
        if port_share is not None:
            environ[PORT_SHARE_ENV] = port_share
        return environ


@dataclasses.dataclass
class LastJob:
    """A command (not a pytest session) queued after the sessions: it starts once a slot is
    free and no session waits, i.e. in the pool's tail, where the last session runs alone and
    half the machine would idle. Its output is printed whole when it ends, like a session's."""

    label: str
    argv: Sequence[str]
    budget: float | None = None

    def command(self) -> list[str]:
        return list(self.argv)

    def environ(self, port_share: str | None) -> dict[str, str]:
        environ = dict(os.environ)
        if port_share is not None:
            environ[PORT_SHARE_ENV] = port_share
        return environ


def run_sessions(sessions: Sequence[Session | LastJob], jobs: int) -> list[str]:
    """Run every session, up to ``jobs`` at once; returns the labels of those that failed.

    One at a time, pytest writes straight to this terminal. Side by side, each session writes
    to its own file, printed whole when it ends, so every session's output stays in one piece
    and ends with its pytest summary line.
    """
    if jobs <= 1 or len(sessions) == 1:
        failed: list[str] = []
        for session in sessions:
            log(f"{session.label}: running test-registered")
            started = time.monotonic()
            code = subprocess.run(
                session.command(), env=session.environ(None), cwd=ROOT, check=False
            ).returncode
            failed += finished(session, code, time.monotonic() - started)
        return failed
    with tempfile.TemporaryDirectory(prefix="sglang-envs-") as logs:
        return _run_side_by_side(sessions, jobs, Path(logs))


def _run_side_by_side(sessions: Sequence[Session | LastJob], jobs: int, logs: Path) -> list[str]:
    waiting = list(enumerate(sessions))
    running: dict[int, tuple[subprocess.Popen, Path, float, int]] = {}
    # Port shares go by slot, not by session: only ``jobs`` sessions run at once, so each gets
    # 1/jobs of the range however many the pool holds (a nodes' host also binds ports SGLang
    # derives from the harness's, which a denser share would meet sooner).
    free_slots = list(range(jobs))
    failed: list[str] = []
    heartbeat = time.monotonic() + HEARTBEAT_SECONDS
    try:
        while waiting or running:
            while waiting and free_slots:
                index, session = waiting.pop(0)
                slot = free_slots.pop(0)
                out = logs / f"{index}.log"
                with open(out, "wb") as sink:
                    proc = subprocess.Popen(
                        session.command(),
                        env=session.environ(f"{slot}/{jobs}"),
                        cwd=ROOT,
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                    )
                running[index] = (proc, out, time.monotonic(), slot)
                log(f"{session.label}: running (output when it ends)")
            for index, (proc, out, started, slot) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[index]
                free_slots.append(slot)
                seconds = time.monotonic() - started
                log(f"---- {sessions[index].label}: exit {proc.returncode} after {seconds:.0f} s")
                sys.stdout.flush()
                sys.stdout.buffer.write(out.read_bytes())
                sys.stdout.flush()
                failed += finished(sessions[index], proc.returncode, seconds)
            if running and time.monotonic() > heartbeat:
                names = ", ".join(sessions[index].label for index in running)
                log(f"still running: {names}")
                heartbeat = time.monotonic() + HEARTBEAT_SECONDS
            time.sleep(1.0)
    finally:
        for proc, _, _, _ in running.values():
            proc.kill()
            proc.wait()
    return failed


def over_budget(job: Session | LastJob, seconds: float) -> bool:
    return job.budget is not None and seconds > OVER_BUDGET_FACTOR * job.budget


def finished(job: Session | LastJob, code: int, seconds: float) -> list[str]:
    """Records the job's wall time (``phases.py``); the label when it failed or took more than
    ``OVER_BUDGET_FACTOR`` times its budget, else nothing."""
    note = "" if job.budget is None else f"budget {job.budget:.0f} s"
    over = over_budget(job, seconds)
    if over:
        log(f"{job.label}: {seconds:.0f} s, over {OVER_BUDGET_FACTOR:g} times its {note}")
        note = f"{note}: over {OVER_BUDGET_FACTOR:g}x"
    phases.record(job.label, seconds, code, note)
    if code != 0:
        return [job.label]
    return [f"{job.label} (over {OVER_BUDGET_FACTOR:g}x its budget)"] if over else []


def report(failed: list[str], sessions: Sequence[Session | LastJob]) -> int:
    if failed:
        log(f"test-registered failed on {', '.join(failed)}")
        return 1
    log(f"test-registered passed on {', '.join(session.label for session in sessions)}")
    return 0
