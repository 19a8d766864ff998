"""Faults at points of SGLang's real launch: each ends with no process of the node left.

CPU-only, through the harness's nodes (``overlay_harness.node``: SGLang's real launch code with
the stand-in scheduler; ``overlay_harness.providers.http_node``: the leader through
``launch_server``). SGLang's crash-diagnostic waits are off (``SGLANG_PYSPY_DUMP_BEFORE_CRASH=0``,
``SGLANG_CUDA_COREDUMP_BEFORE_CRASH=0``). Each test prints the time from the fault to a clean
node (no process carrying the node's tag) for the fault table.

Faults:
- a follower's schedulers SIGKILLed before they report ready (the stand-in's
  ``OVERLAY_HARNESS_SCHEDULER_FAULT=kill_before_ready``): the launch fails naming the dead
  scheduler;
- a follower's scheduler SIGKILLed between its readiness and the follower server's start (the
  stand-in's ``kill_after_ready``: its ready message reaches the node only once it is dead):
  the follower (``launch_server``, SGLang's blocking follower branch) fails naming the
  scheduler, as the overlay's server finds it dead before going live;
- one of a follower's two schedulers SIGKILLed while the follower serves (metadata server
  SERVING), the one SGLang's follower branch joins last: SGLang would wait on the live one,
  and once both ended log them and return, so ``launch_server`` would exit 0; the overlay
  waits on both, reaps the other and fails the node naming the scheduler and the signal;
- the leader's scheduler SIGKILLed while serving (a ``--sidecar`` running): SGLang's
  ``SubprocessWatchdog`` names the crashed scheduler and SIGQUITs the server; the sidecar goes
  with it;
- the follower engine process SIGKILLed while serving with a ``--sidecar-on-followers``
  sidecar: the sidecar's shim and provider are gone within 2 s, the schedulers follow;
- a leader ``--sidecar`` that exits 3 every time under ``--sidecar-restart on-failure
  --sidecar-max-restarts 2``: the supervisor gives up and SIGQUITs the server, which exits
  non-zero naming the sidecar.

The follower's metadata port already taken (the launch fails naming the address) is
``entrypoints/test_follower_metadata.py``'s port-taken scenario, which prints its row too.
"""

import contextlib
import json
import os
import signal
import sys
import time
import unittest
from pathlib import Path
from unittest import mock

from overlay_harness import cluster, standin
from overlay_harness.checks import report_fault
from overlay_harness.cluster import EngineGroup, HttpLeader
from overlay_harness.testcase import TinyModelTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=137, suite="base-a-test-cpu")

RELEASE = releases.installed_sglang_version() or ""
NO_CRASH_DIAGNOSTICS = {
    "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
}
CLEAN_DEADLINE = 60.0
SIDECAR_GONE_DEADLINE = 2.0
DUMP_PROVIDER = "security.sidecar_dump"
CRASHING_PROVIDER = "faults.crashing_sidecar"


class LaunchServerFollower(cluster.Node):
    """A follower through ``launch_server``: SGLang's blocking follower branch, which returns
    only when its schedulers have exited (``overlay_harness.node`` returns at once)."""

    module = "overlay_harness.providers.http_node"


def spawned_children(pid: int) -> list[int]:
    """Live child processes of ``pid`` other than ``multiprocessing``'s resource tracker (on a
    follower: its schedulers). Not by ``spawn_main`` in the command line: on 0.5.19 a
    scheduler's process title replaces it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
            if int(fields[1]) == pid and fields[0] != "Z" and b"resource_tracker" not in cmdline:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def listener_pid(port: int, candidates: list[int]) -> int | None:
    """Which of ``candidates`` holds a TCP socket listening on ``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] == "0A":  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    for pid in candidates:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return pid
    return None


class TestLaunchFaults(TinyModelTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._env = mock.patch.dict(os.environ, NO_CRASH_DIAGNOSTICS)
        cls._env.start()

    @classmethod
    def tearDownClass(cls):
        try:
            cls._env.stop()
        finally:
            super().tearDownClass()

    @contextlib.contextmanager
    def node(self, cls: type, args: list[str], name: str):
        with cluster.running(cls(args, self.workdir, name)) as node:
            yield node

    def test_follower_schedulers_killed_before_ready(self):
        group = EngineGroup(self.model, 2, ["--tp", "2"])
        with (
            mock.patch.dict(os.environ, {standin.FAULT_ENV: "kill_before_ready"}),
            self.node(cluster.Node, group.for_node(1), "follower") as follower,
        ):
            event = follower.ready()
            failed_at = time.monotonic()
            self.assertEqual(event["event"], "error", follower.log_tail())
            self.assertRegex(event["error"].lower(), r"schedul|dead|died|exit", event)
            follower.proc.wait(timeout=CLEAN_DEADLINE)
            self.assertNotEqual(follower.proc.returncode, 0)
            follower.wait_gone(CLEAN_DEADLINE)
            report_fault(
                "follower schedulers SIGKILLed before ready",
                f"exit {follower.proc.returncode}: {event['error'][:120]}",
                time.monotonic() - failed_at,
            )

    def test_follower_scheduler_killed_between_ready_and_server_start(self):
        group = EngineGroup(self.model, 2, ["--tp", "2"])
        with (
            mock.patch.dict(os.environ, {standin.FAULT_ENV: "kill_after_ready"}),
            self.node(LaunchServerFollower, group.for_node(1), "follower") as follower,
        ):
            event = follower.ready()
            failed_at = time.monotonic()
            self.assertEqual(event["event"], "error", follower.log_tail())
            self.assertRegex(
                event["error"], r"scheduler process \d+ exited before the follower metadata", event
            )
            follower.proc.wait(timeout=CLEAN_DEADLINE)
            self.assertNotEqual(follower.proc.returncode, 0)
            follower.wait_gone(CLEAN_DEADLINE)
            self.assertNotIn("is SERVING", follower.log_path.read_text(errors="replace"))
            report_fault(
                "follower scheduler SIGKILLed between ready and the follower server's start",
                f"exit {follower.proc.returncode}: {event['error'][:160]}",
                time.monotonic() - failed_at,
            )

    def test_follower_scheduler_killed_while_serving(self):
        # Two schedulers on the follower (TP 4 over two nodes); the one killed is the one
        # SGLang's follower branch joins last, so waiting on them in order would block on the
        # live one forever.
        group = EngineGroup(self.model, 2, ["--tp", "4"])
        with self.node(LaunchServerFollower, group.for_node(1), "follower") as follower:
            cluster.wait_for(
                lambda: follower.health() == cluster.SERVING or follower.proc.poll() is not None,
                cluster.NODE_READY_DEADLINE,
                "the follower metadata server to be SERVING",
            )
            self.assertIsNone(follower.proc.poll(), follower.log_tail())
            schedulers = sorted(spawned_children(follower.proc.pid))
            self.assertEqual(len(schedulers), 2, schedulers)
            os.kill(schedulers[-1], signal.SIGKILL)
            killed_at = time.monotonic()
            event = follower.ready(timeout=CLEAN_DEADLINE)
            follower.proc.wait(timeout=CLEAN_DEADLINE)
            self.assertNotEqual(follower.proc.returncode, 0, follower.log_tail())
            self.assertEqual(event["event"], "error", event)
            self.assertIn(f"scheduler process {schedulers[-1]} (signal SIGKILL)", event["error"])
            follower.wait_gone(CLEAN_DEADLINE)
            report_fault(
                "one of two follower schedulers SIGKILLed while the follower serves",
                f"exit {follower.proc.returncode}: {event['error'][:160]}",
                time.monotonic() - killed_at,
            )

    def test_follower_engine_killed_takes_its_sidecar_down(self):
        group = EngineGroup(self.model, 2, ["--tp", "2", "--dp", "2", "--enable-dp-attention"])
        dump = self.workdir / "follower-sidecar"
        follower_args = group.for_node(
            1, DUMP_PROVIDER, ["--sidecar-on-followers", "--dump", str(dump)]
        )
        with cluster.nodes(group.for_node(0), follower_args) as (leader, follower):
            for node in (leader, follower):
                node.expect_ready()
            path = cluster.wait_for(
                lambda: sorted(dump.parent.glob(f"{dump.name}.*[0-9].json")),
                240,
                "the follower sidecar to start",
            )[0]
            record = json.loads(path.read_text())
            provider, shim = record["pid"], record["ppid"]
            self.assertTrue(alive(provider) and alive(shim))
            os.kill(follower.proc.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            cluster.wait_for(
                lambda: not alive(provider) and not alive(shim),
                CLEAN_DEADLINE,
                "the follower sidecar's shim and provider to exit",
            )
            sidecar_gone = time.monotonic() - killed_at
            follower.proc.wait(timeout=CLEAN_DEADLINE)
            self.assertEqual(follower.proc.returncode, -signal.SIGKILL)
            follower.wait_gone(CLEAN_DEADLINE)
            clean = time.monotonic() - killed_at
            report_fault(
                "follower engine process SIGKILLed while serving",
                f"exit {follower.proc.returncode} (SIGKILL); shim+provider gone in "
                f"{sidecar_gone:.2f} s",
                clean,
            )
            self.assertLess(sidecar_gone, SIDECAR_GONE_DEADLINE)

    def test_leader_scheduler_killed_while_serving(self):
        group = EngineGroup(self.model, 1, ["--tp", "1"])
        dump = self.workdir / "leader-sidecar"
        args = group.for_node(0, DUMP_PROVIDER, ["--dump", str(dump)])
        with self.node(HttpLeader, args, "leader") as leader:
            leader.expect_ready()
            path = cluster.wait_for(
                lambda: sorted(dump.parent.glob(f"{dump.name}.*[0-9].json")),
                240,
                "the leader sidecar to start",
            )[0]
            provider = json.loads(path.read_text())["pid"]
            # The stand-in scheduler is the process listening on the KV-events port.
            schedulers = [listener_pid(group.kv_base, cluster.pids_with_tag(leader.tag))]
            self.assertIsNotNone(schedulers[0], "no process of the node listens on the KV port")
            os.kill(schedulers[0], signal.SIGKILL)
            killed_at = time.monotonic()
            leader.proc.wait(timeout=CLEAN_DEADLINE)
            self.assertNotEqual(leader.proc.returncode, 0)
            leader.wait_gone(CLEAN_DEADLINE)
            clean = time.monotonic() - killed_at
            self.assertFalse(alive(provider))
            log = leader.log_path.read_text(errors="replace")
            crashed = next(
                (line for line in log.splitlines() if f"pid={schedulers[0]}" in line), ""
            )
            self.assertIn("crashed", crashed, leader.log_tail())
            report_fault(
                "leader scheduler SIGKILLed while serving (with a --sidecar)",
                f"exit {leader.proc.returncode}: {crashed.strip()[-140:]}",
                clean,
            )

    def test_leader_sidecar_crash_loop_exhausts_the_restart_budget(self):
        group = EngineGroup(self.model, 1, ["--tp", "1"])
        sidecar_args = [
            "--sidecar-restart", "on-failure",
            "--sidecar-max-restarts", "2",
            "--sidecar-restart-window", "120",
        ]  # fmt: skip
        args = group.for_node(0, CRASHING_PROVIDER, sidecar_args)
        with self.node(HttpLeader, args, "leader") as leader:
            started = time.monotonic()
            leader.proc.wait(timeout=300)
            exited = time.monotonic()
            self.assertNotEqual(leader.proc.returncode, 0)
            log = leader.log_path.read_text(errors="replace")
            self.assertIn("giving up", log)
            self.assertIn("triggering SIGQUIT", log)
            self.assertEqual(log.count("restarting in"), 2, leader.log_tail())
            leader.wait_gone(CLEAN_DEADLINE)
            give_up = next(line for line in log.splitlines() if "giving up" in line)
            report_fault(
                "leader sidecar crash loop (exit 3, on-failure, 2 restarts)",
                f"exit {leader.proc.returncode}: {give_up.strip()[-160:]}",
                time.monotonic() - exited,
            )
            sys.stderr.write(
                f"[{RELEASE}] crash loop: node launch to exit {exited - started:.1f} s\n"
            )


if __name__ == "__main__":
    unittest.main()
