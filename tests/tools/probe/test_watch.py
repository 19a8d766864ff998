"""``probe --watch``: the live view under a real pseudo-terminal, as lines in a pipe, and a
relaunch seen through a new incarnation.

Nodes are the native metadata server serving snapshots of real, bound stand-in publishers that
publish while the view runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import IO

import zmq
from dev_paths import child_environ
from probe_nodes import CLI, PACKAGE_PARENT, cli_environ, feeding, stand_in_publishers
from sglang_sidecar_overlay._native import start_metadata_server
from sglang_sidecar_overlay.contract.incarnation import Incarnation
from sglang_sidecar_overlay.contract.server_info import render_server_info
from sglang_sidecar_overlay.tools import probe
from sglang_sidecar_overlay.tools.probe.watch import NodeView, render_lines, render_table, run_watch
from sglang_sidecar_overlay.tools.selftest import StandInPublisher, node_snapshot

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NEVER = re.compile(r"(?!)")


@contextlib.contextmanager
def watched_node(ranks: tuple[int, ...] = (2, 3)) -> Iterator[tuple[str, list]]:
    """A served follower snapshot of live publishers; yields (HOST:PORT, publishers)."""
    with contextlib.ExitStack() as stack:
        publishers = stack.enter_context(stand_in_publishers(*ranks))
        info = node_snapshot(publishers, legacy_dp_size=True)
        server = stack.enter_context(
            start_metadata_server("127.0.0.1", 0, render_server_info(info))
        )
        server.set_serving(True)
        yield probe.grpc_target(server.host, server.port), publishers


def read_until(fd: int, pattern: re.Pattern, deadline: float, seen: bytearray) -> re.Match | None:
    """Read the pty into ``seen`` until ``pattern`` matches its text or the deadline passes."""
    while time.monotonic() < deadline:
        match = pattern.search(seen.decode("utf-8", errors="replace"))
        if match:
            return match
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return pattern.search(seen.decode("utf-8", errors="replace"))


REDRAW = "\x1b[H\x1b[J"
SHOW_CURSOR = re.compile(r"\x1b\[\?25h")
# How long a watch gets to print three lines of a rank with events, on a loaded machine.
WATCH_DEADLINE = 90.0
# Two ranks with a live rate, as the table draws them.
LIVE_ROW = re.compile(r"^1\s+3\s+\d+\.\d\s+\d+\s+0\s+0\s+\d+\s+SERVING", re.M)


def spawn_watch_on_a_terminal(target: str, sigint: signal.Handlers) -> tuple[int, int]:
    """``probe TARGET --watch`` with a new pty as its controlling terminal and SIGINT set to
    ``sigint`` (a login shell gives its jobs SIG_DFL, whatever this test inherited);
    (pid, the pty's master fd)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child
        signal.signal(signal.SIGINT, sigint)
        environ = child_environ(PACKAGE_PARENT, inherit=False)
        environ["COLUMNS"] = "100"
        os.execve(
            sys.executable,
            [sys.executable, "-m", "sglang_sidecar_overlay", "probe", target, "--watch"],
            environ,
        )
    return pid, fd


def wait_for_redraws(fd: int, seen: bytearray, count: int, deadline: float) -> str:
    """Read until ``count`` redraws past what ``seen`` holds, the last showing a live row."""
    wanted = seen.decode("utf-8", errors="replace").count(REDRAW) + count
    while time.monotonic() < deadline:
        screen = seen.decode("utf-8", errors="replace")
        if screen.count(REDRAW) >= wanted and LIVE_ROW.search(screen.split(REDRAW)[-1]):
            break
        read_until(fd, NEVER, time.monotonic() + 0.5, seen)
    screen = seen.decode("utf-8", errors="replace")
    assert screen.count(REDRAW) >= wanted, screen
    return screen


def wait_for_exit(pid: int, fd: int, seen: bytearray, deadline: float) -> int | None:
    """The child's wait status once it exits (reading its terminal meanwhile), or None."""
    read_until(fd, SHOW_CURSOR, deadline, seen)
    while time.monotonic() < deadline:
        done, status_word = os.waitpid(pid, os.WNOHANG)
        if done:
            return status_word
        read_until(fd, NEVER, time.monotonic() + 0.2, seen)
    return None


@contextlib.contextmanager
def reaped(pid: int, fd: int) -> Iterator[list[int | None]]:
    """Yields a one-item list for the child's wait status; kills and reaps it if unset."""
    status: list[int | None] = [None]
    try:
        yield status
    finally:
        if status[0] is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


def test_watch_redraws_in_place_on_a_terminal_and_stops_on_ctrl_c() -> None:
    with watched_node() as (target, publishers), feeding(publishers, interval=0.02):
        pid, fd = spawn_watch_on_a_terminal(target, signal.SIG_DFL)
        seen = bytearray()
        with reaped(pid, fd) as status:
            wait_for_redraws(fd, seen, 3, time.monotonic() + 60)
            os.write(fd, b"\x03")  # Ctrl-C, delivered by the terminal as SIGINT
            status[0] = wait_for_exit(pid, fd, seen, time.monotonic() + 30)
        status = status[0]
    assert status is not None and os.waitstatus_to_exitcode(status) == 0
    text = seen.decode("utf-8", errors="replace")
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    assert text.startswith("\x1b[?25l") and text.rstrip().endswith("\x1b[?25h")
    last = ANSI.sub("", text.split("\x1b[H\x1b[J")[-1])
    lines = last.splitlines()
    assert lines[0].startswith("sglang-sidecar-overlay probe --watch ")
    assert lines[1].startswith(f"  {target}: node_rank 1, launch ")
    assert lines[2].split() == [
        "NODE",
        "RANK",
        "EVENTS/S",
        "LAST",
        "SEQ",
        "GAPS",
        "RESETS",
        "REPLAYED",
        "HEALTH",
    ]
    # The terminal echoes the Ctrl-C as ^C after the last table.
    rows = [line.split() for line in lines[3:] if line.strip() and line.strip() != "^C"]
    assert [row[:2] for row in rows] == [["1", "2"], ["1", "3"]]
    for row in rows:
        assert float(row[2]) > 0 and row[4:6] == ["0", "0"] and row[7] == "SERVING"


def test_watch_started_with_sigint_ignored_keeps_it_and_stops_on_sigterm() -> None:
    # As from a background job of a script: the terminal's Ctrl-C is not for this process.
    with watched_node() as (target, publishers), feeding(publishers, interval=0.02):
        pid, fd = spawn_watch_on_a_terminal(target, signal.SIG_IGN)
        seen = bytearray()
        with reaped(pid, fd) as status:
            wait_for_redraws(fd, seen, 2, time.monotonic() + 60)
            os.write(fd, b"\x03")
            # Still watching: two more redraws after the Ctrl-C, the process not ended.
            wait_for_redraws(fd, seen, 2, time.monotonic() + 60)
            assert os.waitpid(pid, os.WNOHANG) == (0, 0)
            os.kill(pid, signal.SIGTERM)
            status[0] = wait_for_exit(pid, fd, seen, time.monotonic() + 30)
        assert status[0] is not None and os.waitstatus_to_exitcode(status[0]) == 0
    text = seen.decode("utf-8", errors="replace")
    assert "Traceback" not in text
    assert text.rstrip().endswith("\x1b[?25h")


def rank_lines(stream: IO[str], rank: int, deadline: float) -> list[str]:
    """The watch's lines for ``rank``, read until three of them, the last one counting events
    (a fixed watch duration would count the CLI's start-up against it on a loaded machine)."""
    seen: list[str] = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        line = stream.readline() if ready else ""
        if not line:
            break
        seen.append(line)
        lines = [ln for ln in seen if f" rank={rank} " in ln]
        if len(lines) >= 3 and "events_per_s=-" not in lines[-1]:
            return lines
    raise AssertionError("".join(seen))


def test_watch_prints_lines_when_not_a_terminal() -> None:
    with watched_node() as (target, publishers), feeding(publishers, interval=0.02):
        watch = subprocess.Popen(
            [*CLI, "probe", target, "--watch"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_environ(),
        )
        try:
            rank3 = rank_lines(watch.stdout, 3, time.monotonic() + WATCH_DEADLINE)
        finally:
            watch.terminate()
            rest, errors = watch.communicate(timeout=30)
    # SIGTERM ends it cleanly, as Ctrl-C does.
    assert watch.returncode == 0, errors
    assert "\x1b[" not in "".join(rank3) + rest
    fields = dict(item.split("=", 1) for item in rank3[-1].split()[2:])
    assert fields["node_rank"] == "1" and fields["health"] == "SERVING"
    assert float(fields["events_per_s"]) > 0 and int(fields["last_seq"]) > 0
    assert fields["gaps"] == "0" and fields["resets"] == "0"


def test_watch_counts_a_relaunch_when_the_incarnation_changes() -> None:
    context = zmq.Context()
    try:
        pub = StandInPublisher(context, 2)
        try:
            first = node_snapshot([pub], legacy_dp_size=True, incarnation=Incarnation.new())
            second = {**first, "incarnation": Incarnation.new().to_json()}
            with start_metadata_server("127.0.0.1", 0, render_server_info(first)) as server:
                server.set_serving(True)
                target = probe.grpc_target(server.host, server.port)
                node = NodeView(target)
                node.refresh(timeout=5)
                assert node.relaunches == 0 and node.incarnation == first["incarnation"]["id"]
                node.refresh(timeout=5)
                assert node.relaunches == 0
                port = server.port
            # The same node, relaunched on the same port with a new incarnation.
            with start_metadata_server("127.0.0.1", port, render_server_info(second)) as server:
                server.set_serving(True)
                node.refresh(timeout=5)
                assert node.relaunches == 1 and node.incarnation == second["incarnation"]["id"]
                assert "resets=1 " in render_lines([node])
                assert f"  {target}: node_rank 1, launch {node.incarnation[:12]}" in render_table(
                    [node]
                )
            node.close()
        finally:
            pub.close()
    finally:
        context.term()


def test_watch_of_a_node_that_is_down_says_so_and_ends_on_time() -> None:
    out = io.StringIO()
    report = run_watch(["127.0.0.1:1"], out, duration=1.5, interval=0.5, timeout=1, tty=False)
    assert report.exit_code() == 0
    lines = out.getvalue().splitlines()
    assert lines and all(" 127.0.0.1:1 health=DOWN error=" in line for line in lines)
    (node,) = report.to_json()["nodes"]
    assert node["health"] == "DOWN" and node["error"] and node["ranks"] == []


def test_watch_json_prints_one_object_with_each_rank_at_the_end() -> None:
    with watched_node() as (target, publishers), feeding(publishers, interval=0.02):
        result = subprocess.run(
            [*CLI, "probe", target, "--watch", "4", "--json"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=WATCH_DEADLINE,
            env=cli_environ(),
            check=False,
        )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # one object, and no view drawn around it
    assert report["ok"] is True and report["targets"] == [target]
    assert 4 <= report["seconds"] < WATCH_DEADLINE
    (node,) = report["nodes"]
    assert node["node_rank"] == 1 and node["health"] == "SERVING" and node["error"] is None
    assert [rank["dp_rank"] for rank in node["ranks"]] == [2, 3]
    for rank in node["ranks"]:
        assert rank["events"] > 0 and rank["last_seq"] >= 0 and rank["gaps"] == 0
