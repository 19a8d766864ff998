"""Lifecycle tests of the sidecar supervisor with real processes and real signals.

Covers start-up, crash detection, the restart policy, the bounded group stop, SIGTERM
chaining, and parent death (a real parent process SIGKILLed). Helper parents run as
``python -c`` children of the test; everything they start is killed at teardown.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sglang_sidecar_overlay
from conftest import TESTS
from sglang_sidecar_overlay.sidecar import proctree, shim, supervisor
from sglang_sidecar_overlay.sidecar.supervisor import SidecarOptions
from sidecar_providers.harness import (
    Supervisors,
    env_with_paths,
    gone,
    kill_all,
    proc_key,
    read_log,
    read_report,
    tree_of,
    wait_for,
)

TESTS_DIR = TESTS
# How long a test waits for something that must happen (a deadline, not a timing claim: the
# figures are the benchmark's).
DEADLINE = 30.0
PACKAGE_ROOT = Path(sglang_sidecar_overlay.__file__).resolve().parent.parent


@pytest.fixture
def supervise():
    supervisors = Supervisors()
    yield supervisors.make
    supervisors.close()


@pytest.fixture
def reaper():
    """Processes registered here are SIGKILLed at teardown if still running."""
    keys: list[tuple[int, int]] = []
    popens: list[subprocess.Popen] = []
    yield keys, popens
    for p in popens:
        keys.extend(tree_of(p.pid))
    kill_all(keys)
    for p in popens:
        p.kill()
        p.wait()


# -- start-up ---------------------------------------------------------------------------------


def test_provider_main_runs_in_its_own_session(supervise, tmp_path) -> None:
    # Spawn-to-main latency is a figure, not a pass/fail: `python scripts/bench_sidecar.py`.
    report = tmp_path / "r.json"
    sup, fatal = supervise("serve", ["--report", str(report)])
    sup.start()
    provider = read_report(report)
    assert provider["pid"] != os.getpid()
    assert os.getsid(provider["pid"]) == sup.pid
    sup.stop()
    assert fatal.calls == []


def test_sidecar_started_from_short_lived_thread_survives_it(supervise, tmp_path) -> None:
    report = tmp_path / "r.json"
    sup, fatal = supervise("serve", ["--report", str(report)])
    starter = threading.Thread(target=sup.start)
    starter.start()
    starter.join()
    provider = proc_key(read_report(report)["pid"])
    assert provider is not None
    # PDEATHSIG would fire as soon as the spawning thread ended; give it ample time to show.
    assert not wait_for(lambda: gone(provider) or fatal.calls, 1.0)
    assert sup.is_alive()


# -- crash detection --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "description"), [("exit3", "exited with code 3"), ("segv", "killed by SIGSEGV")]
)
def test_crash_is_reported_once_with_its_cause(
    supervise, tmp_path, module: str, description: str
) -> None:
    # Detection latency (median and max of 20) is measured by `python scripts/bench_sidecar.py`.
    for i in range(3):
        report = tmp_path / f"r{i}.json"
        sup, fatal = supervise(module, ["--report", str(report)])
        sup.start()
        assert fatal.event.wait(20)
        # The supervisor thread has finished with the process: nothing more can be reported.
        assert wait_for(lambda s=sup: not s.is_alive() and s.pid is None, DEADLINE)
        assert fatal.calls == [f"sidecar 'sidecar_providers.{module}' {description}"]


def test_clean_exit_while_serving_is_fatal(supervise, tmp_path) -> None:
    sup, fatal = supervise("exit0", ["--report", str(tmp_path / "r.json")])
    sup.start()
    assert fatal.event.wait(20)
    assert fatal.calls == [
        "sidecar 'sidecar_providers.exit0' exited cleanly (code 0) while the server was running"
    ]


def test_sidecar_killed_from_outside_is_detected(supervise, tmp_path) -> None:
    report = tmp_path / "r.json"
    sup, fatal = supervise("serve", ["--report", str(report)])
    sup.start()
    read_report(report)
    os.kill(sup.pid, signal.SIGKILL)
    assert fatal.event.wait(5)
    assert fatal.calls == ["sidecar 'sidecar_providers.serve' killed by SIGKILL"]
    provider = proc_key(read_report(report)["pid"])
    assert provider is None or wait_for(lambda: gone(provider), DEADLINE)


# -- restart policy ---------------------------------------------------------------------------


def test_on_failure_restarts_with_backoff_then_gives_up(supervise, tmp_path) -> None:
    report = tmp_path / "r.json"
    opts = SidecarOptions(shutdown_timeout=2.0, restart="on-failure", max_restarts=2)
    sup, fatal = supervise("exit3", ["--report", str(report)], options=opts)
    sup.start()
    assert fatal.event.wait(30)
    runs = read_log(report)
    assert len(runs) == 3
    assert sup.restarts == 2
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(runs)]
    # At least 1 s then 2 s (+ up to 10 % jitter): never earlier, however loaded the machine.
    # How much later depends on the load; backoff_delay's own test pins the figures.
    assert gaps[0] >= 1.0 and gaps[1] >= 2.0, gaps
    assert fatal.calls == ["sidecar 'sidecar_providers.exit3' exited with code 3"]


def test_stop_during_backoff_returns_at_once_without_fatal(
    supervise, tmp_path, monkeypatch
) -> None:
    # A backoff of ten minutes and a shutdown timeout of five minutes: a stop (or a supervisor
    # thread) that waited out either would miss the deadlines below.
    monkeypatch.setattr(supervisor, "BACKOFF_BASE", 600.0)
    monkeypatch.setattr(supervisor, "BACKOFF_CAP", 600.0)
    report = tmp_path / "r.json"
    opts = SidecarOptions(shutdown_timeout=300.0, restart="on-failure", max_restarts=5)
    sup, fatal = supervise("exit3", ["--report", str(report)], options=opts)
    sup.start()
    read_report(report)
    assert wait_for(lambda: sup.pid is None, DEADLINE)  # exited; now waiting out the backoff
    stopper = threading.Thread(target=sup.stop, daemon=True)
    stopper.start()
    stopper.join(60)
    assert not stopper.is_alive(), "stop() waited for the backoff"
    # The backoff itself was cut short: the supervisor thread ended, no restart pending.
    assert sup._thread is not None
    sup._thread.join(60)
    assert not sup._thread.is_alive(), "the supervisor thread still waits out the backoff"
    assert fatal.calls == []
    assert sup.restarts == 0
    assert len(read_log(report)) == 1


# -- stop -------------------------------------------------------------------------------------


def test_stop_cooperative_child(supervise, tmp_path, caplog) -> None:
    report = tmp_path / "r.json"
    sup, fatal = supervise("serve", ["--report", str(report)])
    sup.start()
    provider = proc_key(read_report(report)["pid"])
    with caplog.at_level(logging.INFO, logger=supervisor.__name__):
        sup.stop()
    assert Path(f"{report}.term").exists()  # it got SIGTERM and exited by itself
    assert "sending SIGKILL" not in caplog.text and "sending SIGTERM" in caplog.text
    assert gone(provider)
    assert not sup.is_alive() and sup.pid is None
    assert fatal.calls == []


def test_stop_sigterm_ignoring_tree_is_bounded_and_kills_grandchildren(
    supervise, reaper, tmp_path
) -> None:
    keys, popens = reaper
    # A sibling: a child of this process that is not a descendant of the sidecar.
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    popens.append(sibling)
    report = tmp_path / "r.json"
    timeout = 1.0
    args = ["--report", str(report), "--ignore-term"]
    sup, fatal = supervise("grandchildren", args, options=SidecarOptions(shutdown_timeout=timeout))
    sup.start()
    got = read_report(report)
    grandchildren = [tuple(k) for k in got["grandchildren"]]
    keys.extend(grandchildren)
    shim_key, provider = proc_key(sup.pid), proc_key(got["pid"])
    assert proctree.group_members(sup.pid) and grandchildren[1][0] not in dict(
        proctree.group_members(sup.pid)
    )  # the second grandchild really left the group
    t0 = time.monotonic()
    sup.stop()
    # SIGKILL only after the shutdown timeout (never earlier); how long past it is the load's.
    assert time.monotonic() - t0 >= timeout
    for key in (shim_key, provider, *grandchildren):
        assert wait_for(lambda k=key: gone(k), DEADLINE), key
    assert sibling.poll() is None
    assert fatal.calls == []


def test_cooperative_provider_leftovers_are_killed(supervise, reaper, tmp_path, caplog) -> None:
    keys, _ = reaper
    report = tmp_path / "r.json"
    sup, _ = supervise("grandchildren", ["--report", str(report)])
    sup.start()
    grandchildren = [tuple(k) for k in read_report(report)["grandchildren"]]
    keys.extend(grandchildren)
    with caplog.at_level(logging.INFO, logger=supervisor.__name__):
        sup.stop()
    # The provider obeys SIGTERM and its SIGTERM-ignoring leftovers do not hold the stop up
    # until the shutdown timeout: the shim kills them once the provider has exited.
    assert "sending SIGKILL" not in caplog.text and "sending SIGTERM" in caplog.text
    assert all(gone(k) for k in grandchildren)


def test_stop_is_idempotent_and_thread_safe(supervise, tmp_path) -> None:
    report = tmp_path / "r.json"
    sup, fatal = supervise("ignore_term", ["--report", str(report)], SidecarOptions(1.0))
    sup.stop()  # before start: nothing to do
    sup2, _ = supervise("ignore_term", ["--report", str(report)], SidecarOptions(1.0))
    sup2.start()
    read_report(report)
    results = []

    def stopper() -> None:
        t0 = time.monotonic()
        sup2.stop()
        results.append(time.monotonic() - t0)

    threads = [threading.Thread(target=stopper) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 4 and max(results) <= 2.0, results
    sup2.stop()
    assert not sup2.is_alive()
    with pytest.raises(RuntimeError):
        sup.start()
    assert fatal.calls == []


# A process that echoes each line it reads: it answers only while it lives.
_ECHO = """
import sys
for line in iter(sys.stdin.readline, ""):
    print(line, end="", flush=True)
"""


@pytest.fixture
def echo_process() -> Iterator[subprocess.Popen[bytes]]:
    """A child of this test running ``_ECHO``, killed and reaped at teardown (its pipes
    unbuffered here, so nothing is left to flush into a dead process)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def answers(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether ``proc`` echoes a line back within ``timeout`` (a killed process never does)."""
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"ping\n")
    except BrokenPipeError:
        return False
    if not select.select([proc.stdout], [], [], timeout)[0]:
        return False
    return proc.stdout.readline() == b"ping\n"


@pytest.mark.parametrize("reused", [True, False], ids=["pid-reused", "same-process"])
def test_a_reused_pid_is_never_signalled(
    supervise, echo_process, tmp_path, monkeypatch, reused: bool
) -> None:
    # stop() walks the sidecar's tree, then signals the descendants that left its group. Between
    # the two, such a descendant can exit, be reaped, and its pid number go to another process.
    # The walk here is made to have seen that: the pid of `holder`, a process of this test and
    # nothing of the sidecar's, listed as a child of the provider in its own group, with the
    # start time of the process that had it before (one tick earlier). The control lists
    # `holder` itself (its own start time): then the pid is the sidecar's and it is signalled.
    holder = echo_process
    assert answers(holder, DEADLINE)
    held = proctree.read_stat(holder.pid)
    assert held is not None
    report = tmp_path / "r.json"
    sup, fatal = supervise("serve", ["--report", str(report)])
    sup.start()
    provider = read_report(report)["pid"]
    walk = proctree.process_table

    def walked_before_the_pid_changed_hands() -> proctree.ProcTable:
        table = walk()
        table[holder.pid] = held._replace(
            ppid=provider, pgrp=holder.pid, starttime=held.starttime - int(reused)
        )
        return table

    monkeypatch.setattr(proctree, "process_table", walked_before_the_pid_changed_hands)
    sup.stop()
    assert Path(f"{report}.term").exists()  # the stop did run: the provider got its SIGTERM
    assert not sup.is_alive() and fatal.calls == []
    if reused:
        assert answers(holder, DEADLINE), "the process now holding the pid was signalled"
        assert holder.poll() is None
    else:
        assert holder.wait(DEADLINE) == -signal.SIGTERM


# -- parent death -----------------------------------------------------------------------------

_PARENT = """
import json, sys, threading, time
from sglang_sidecar_overlay.sidecar.supervisor import SidecarOptions, SidecarSupervisor
report, ready = sys.argv[1], sys.argv[2]
sup = SidecarSupervisor("sidecar_providers.grandchildren", "http://127.0.0.1:30001",
                        ["--report", report], SidecarOptions(), lambda d: None)
# Started from a thread that ends at once: the sidecar must not depend on it.
t = threading.Thread(target=sup.start)
t.start()
t.join()
with open(ready, "w") as f:
    json.dump({"shim": sup.pid}, f)
while True:
    time.sleep(3600)
"""


def test_parent_sigkill_takes_down_the_whole_sidecar_tree(reaper, tmp_path) -> None:
    keys, popens = reaper
    report, ready = tmp_path / "r.json", tmp_path / "ready.json"
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(report), str(ready)],
        env=env_with_paths(PACKAGE_ROOT, TESTS_DIR),
    )
    popens.append(parent)
    got = read_report(report)
    shim_pid = read_report(ready)["shim"]
    tree = [proc_key(shim_pid), proc_key(got["pid"]), *(tuple(k) for k in got["grandchildren"])]
    assert None not in tree
    keys.extend(tree)
    # The starting thread has ended; the sidecar lives on.
    assert not wait_for(lambda: any(gone(k) for k in tree), 0.5)
    parent.kill()
    t0 = time.monotonic()
    parent.wait()
    assert wait_for(lambda: all(gone(k) for k in tree), DEADLINE), [k for k in tree if not gone(k)]
    assert time.monotonic() - t0 <= 2.0


def _run_shim(parent_pid: int, spec: dict | None, popens: list) -> tuple[subprocess.Popen, int]:
    control_r, control_w = os.pipe()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sglang_sidecar_overlay.sidecar.shim",
            str(parent_pid),
            str(control_r),
        ],
        pass_fds=(control_r,),
        start_new_session=True,
        env=env_with_paths(PACKAGE_ROOT),
    )
    popens.append(proc)
    os.close(control_r)
    if spec is not None:
        # A shim that finds its parent gone exits before reading its spec: the write then
        # meets a closed pipe, and the caller judges the shim by its exit, not by the write.
        with contextlib.suppress(BrokenPipeError):
            os.write(control_w, json.dumps(spec).encode() + b"\n")
    return proc, control_w


def test_shim_death_pipe_eof_stops_the_provider(reaper, tmp_path) -> None:
    keys, popens = reaper
    report = tmp_path / "r.json"
    spec = {
        "module": "sidecar_providers.serve",
        "argv": ["--report", str(report)],
        "sys_path": [str(TESTS_DIR), *sys.path],
    }
    proc, control_w = _run_shim(os.getpid(), spec, popens)
    provider = proc_key(read_report(report)["pid"])
    keys.append(provider)
    os.close(control_w)  # the server is "gone" while PDEATHSIG cannot fire (we live on)
    assert wait_for(lambda: proc.poll() is not None, DEADLINE)
    assert wait_for(lambda: gone(provider), DEADLINE)
    assert Path(f"{report}.term").exists()  # it was asked to stop before being killed


def test_shim_exits_without_running_provider_if_parent_already_gone(reaper, tmp_path) -> None:
    _, popens = reaper
    report = tmp_path / "r.json"
    spec = {"module": "sidecar_providers.serve", "argv": ["--report", str(report)], "sys_path": []}
    # A parent pid that is not the shim's real parent stands for "died before prctl".
    proc, control_w = _run_shim(1, spec, popens)
    try:
        assert proc.wait(20) == 128 + shim.PARENT_DEATH_SIGNAL
    finally:
        os.close(control_w)
    assert not report.exists()


# -- SIGTERM chaining -------------------------------------------------------------------------

_SIGTERM_PARENT = """
import json, os, signal, sys, time
from sglang_sidecar_overlay.sidecar.supervisor import SidecarOptions, SidecarSupervisor
from sidecar_providers.harness import running_sidecar
report, ready, mode = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "chained":
    def previous(signum, frame):
        with open(ready + ".previous", "w") as f:
            json.dump({"sidecar_alive": sup.is_alive()}, f)
        os._exit(7)
    signal.signal(signal.SIGTERM, previous)
sup = SidecarSupervisor("sidecar_providers.serve", "http://127.0.0.1:30001",
                        ["--report", report], SidecarOptions(5.0), lambda d: None)
with running_sidecar(sup):
    with open(ready, "w") as f:
        json.dump({"shim": sup.pid}, f)
    while True:
        time.sleep(3600)
"""


@pytest.mark.parametrize("mode", ["chained", "default"])
def test_sigterm_stops_sidecar_first_then_reaches_previous_handler(
    reaper, tmp_path, mode: str
) -> None:
    keys, popens = reaper
    report, ready = tmp_path / "r.json", tmp_path / "ready.json"
    parent = subprocess.Popen(
        [sys.executable, "-c", _SIGTERM_PARENT, str(report), str(ready), mode],
        env=env_with_paths(PACKAGE_ROOT, TESTS_DIR),
    )
    popens.append(parent)
    provider = proc_key(read_report(report)["pid"])
    shim_key = proc_key(read_report(ready)["shim"])
    keys.extend([provider, shim_key])
    parent.send_signal(signal.SIGTERM)
    code = parent.wait(20)
    assert Path(f"{report}.term").exists()  # the provider got its SIGTERM from stop()
    assert gone(provider) and gone(shim_key)
    if mode == "chained":
        assert code == 7
        assert json.loads(Path(f"{ready}.previous").read_text()) == {"sidecar_alive": False}
    else:
        assert code == -signal.SIGTERM


def test_sigterm_hook_stops_node_sidecars_gracefully(supervise, tmp_path) -> None:
    # SGLang's SIGTERM handler runs the hook, long before its shutdown SIGKILLs the children.
    from sglang_sidecar_overlay.adapters import _launch
    from sglang_sidecar_overlay.adapters import _sidecar as node_sidecars

    report = tmp_path / "r.json"
    sup, fatal = supervise("serve", ["--report", str(report)])
    launch = _launch.begin_node_launch()
    sidecar = node_sidecars.NodeSidecar(sup, "leader", launch.sidecars)
    sidecar.start()
    read_report(report)
    assert sidecar in launch.sidecars
    node_sidecars.after_sigterm_handler(None, object())
    assert wait_for(lambda: sidecar.stopped_at is not None, 10)  # the hook alone stops it
    sidecar.stop()  # the lifespan's call: a no-op now
    assert sup.pid is None and not sup.is_alive()
    assert Path(f"{report}.term").exists()  # SIGTERM and its grace, not a SIGKILL
    assert fatal.calls == []
    assert sidecar not in launch.sidecars
