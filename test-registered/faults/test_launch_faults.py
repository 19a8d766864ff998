"""Faults at points of SGLang's real launch: each ends with no process of the node left.

CPU-only: SGLang's real schedulers on the CPU test platform, nodes through
``overlay_harness.node_process`` (leaders through ``launch_server``; followers through SGLang's
Engine-API follower branch, or its blocking branch where the node's own exit matters), each
node of a two-node group its own host. Faults are injected into the real scheduler processes
(``overlay_harness.scheduler_faults``) or sent as signals. SGLang's crash-diagnostic waits are
off, as on every node of the harness (``overlay_harness.nodes.NO_CRASH_DIAGNOSTICS``). Each test
prints the time from the fault to a clean node (no process carrying the node's tag) for the
fault table.

Faults:
- a bad ``SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE`` value on a leader: the launch fails naming
  the value before the launch's incarnation begins, so before any scheduler starts (0.5.22+
  leaders build their reply per request; without the launch-time read the error would wait
  for the first ``GetServerInfo``);
- a bad ``--sidecar-args`` option on a leader (``--sidecar-restart sometimes``): the launch
  fails naming the option and the value before its incarnation begins, so before any scheduler
  starts (the sidecar itself starts only once the schedulers are up);
- rank 0's KV-events port already taken on the node's host: that rank's scheduler fails its
  publisher's bind at start-up (``Address already in use``, naming the port), so the launch
  fails and nothing of the node is left;
- a follower's scheduler SIGKILLed as it starts (``kill_at_start``): the launch fails naming
  the dead scheduler (no leader needed: it dies before any rendezvous);
- a follower's scheduler SIGKILLed between its readiness and the follower server's start
  (``kill_after_ready``: its ready message reaches the engine only once it is dead): the
  follower (``launch_server``, SGLang's blocking follower branch) fails naming the scheduler,
  as the overlay's server finds it dead before going live;
- the leader's scheduler SIGKILLed while serving (a ``--sidecar`` running): SGLang's
  ``SubprocessWatchdog`` names the crashed scheduler and SIGQUITs the server; the sidecar goes
  with it;
- a leader ``--sidecar`` that exits 3 every time under ``--sidecar-restart on-failure
  --sidecar-max-restarts 2``: the supervisor gives up and SIGQUITs the server, which exits
  non-zero naming the sidecar.

On the rebuilt wheel every fault ends as it does with the plugin; the bad switch's error names
the series' variable (``patches/DIFFERENCES.md`` #3) in the words of SGLang's ``EnvBool``.

Elsewhere: the follower's scheduler SIGKILLed while the follower serves (the end of
``contract/test_relaunch_incarnation``'s second launch: no local scheduler is left to send
SGLang's SIGQUIT, so SGLang's follower branch would log the exit and return, and
``launch_server`` would exit 0; the overlay fails the node naming the scheduler and the
signal), the follower's metadata port already taken (``entrypoints/test_follower_metadata``),
a raising follower scheduler with a sidecar running (``contract/test_two_node_group``), the
follower engine SIGKILLed under its sidecar (``security/test_planted_secrets``), SIGTERM with
requests in flight (``sidecar/test_sidecar_launch``).
"""

import contextlib
import json
import os
import re
import signal
import sys
import time
import unittest
from pathlib import Path

from overlay_harness import differences, nodes
from overlay_harness.checks import alive, report_fault
from overlay_harness.group import EngineGroup
from overlay_harness.scheduler_faults import FAULT_ENV
from overlay_harness.testcase import NodesTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases
from sglang_sidecar_overlay.contract.server_info import LEGACY_DP_SIZE_ENV

register_cpu_ci(est_time=200, suite="base-a-test-cpu")

RELEASE = releases.installed_sglang_version() or ""
CLEAN_DEADLINE = 90.0
DUMP_PROVIDER = "security.sidecar_dump"
CRASHING_PROVIDER = "faults.crashing_sidecar"
# The plugin's start line, or the series' in upstream's words ("Sidecar module X started").
SIDECAR_STARTED = rf"(?i)sidecar (module )?{re.escape(CRASHING_PROVIDER)} started"
# The launch's incarnation line: the plugin's "node launch incarnation <id>", or the series'
# "Server launch incarnation <id>"; logged right before the schedulers start.
LAUNCH_INCARNATION = r"(?i)launch incarnation"
# A bad --sidecar-args option fails the launch before any scheduler starts: well within this.
BAD_OPTION_DEADLINE = 60.0
TP2 = ["--tp", "2"]


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


class TestLaunchFaults(NodesTestCase):
    def assert_failed_and_clean(self, node: nodes.Node, failed_at: float) -> float:
        node.proc.wait(timeout=CLEAN_DEADLINE)
        self.assertNotEqual(node.proc.returncode, 0, node.log_tail())
        node.wait_gone(CLEAN_DEADLINE)
        return time.monotonic() - failed_at

    def test_a_bad_dp_size_switch_fails_the_leader_launch_before_its_schedulers(self):
        # The leader builds its reply per request; the switch is read when its launch starts.
        group = EngineGroup(1, ["--tp", "1"])
        env = dict.fromkeys(differences.DP_SIZE_SWITCH_NAMES, "maybe")
        launch = group.launch(0, env=env)
        with nodes.running(launch, names=["leader"], log_dir=self.workdir) as (leader,):
            event = leader.ready()
            failed_at = time.monotonic()
            self.assertEqual(event["event"], "error", leader.log_tail())
            if differences.on_rebuilt_wheel():
                # The series' name for the switch (#3), and the words of SGLang's EnvBool.
                expected = (
                    f"ValueError: {differences.UPSTREAM_LEGACY_DP_SIZE_ENV}='maybe': "
                    '"maybe" is not a valid boolean value'
                )
            else:
                expected = (
                    f"ValueError: {LEGACY_DP_SIZE_ENV}='maybe' is not a boolean; use one of "
                    "1/true/yes/on or 0/false/no/off"
                )
            self.assertEqual(event["error"], expected)
            clean = self.assert_failed_and_clean(leader, failed_at)
            # Before the launch's incarnation (the plugin's line, or the series' "Server
            # launch incarnation"), so before any scheduler process.
            self.assertNotRegex(leader.log_text(), LAUNCH_INCARNATION)
            report_fault(
                "a bad dp_size switch value on the leader",
                f"exit {leader.proc.returncode}: {event['error'][:120]}",
                clean,
            )

    def test_a_bad_sidecar_option_fails_the_leader_launch_before_its_schedulers(self):
        # The sidecar starts once the schedulers are up; its options are read when the launch
        # starts, so a typo costs no scheduler start and leaves nothing behind.
        bad = ["--sidecar-restart", "sometimes"]
        group = EngineGroup(1, ["--tp", "1"])
        launch = group.launch(0, sidecar=CRASHING_PROVIDER, sidecar_args=bad)
        launched_at = time.monotonic()
        with nodes.running(launch, names=["leader"], log_dir=self.workdir) as (leader,):
            event = leader.ready(timeout=BAD_OPTION_DEADLINE)
            failed_at = time.monotonic()
            self.assertEqual(event["event"], "error", leader.log_tail())
            # The series ends its sentence with a period, as upstream's messages do.
            self.assertRegex(
                event["error"],
                r"^ValueError: --sidecar-restart must be one of never, on-failure, "
                r"got 'sometimes'\.?$",
            )
            # Failed within a minute of the launch: no scheduler started, nothing hung.
            self.assertLess(failed_at - launched_at, BAD_OPTION_DEADLINE, leader.log_tail())
            clean = self.assert_failed_and_clean(leader, failed_at)
            self.assertNotRegex(leader.log_text(), LAUNCH_INCARNATION)
            self.assertNotRegex(leader.log_text(), SIDECAR_STARTED)
            report_fault(
                "a bad --sidecar-args option on the leader",
                f"exit {leader.proc.returncode}: {event['error'][:120]}",
                clean,
            )

    def test_a_taken_kv_port_fails_that_ranks_scheduler(self):
        group = EngineGroup(1, ["--tp", "1"])
        with (
            nodes.holding_port(group, 0, group.kv_base),
            nodes.running(group.launch(0), names=["leader"], log_dir=self.workdir) as (leader,),
        ):
            # The scheduler's bind fails in its start-up; SGLang's SIGQUIT path then kills the
            # launching process (exit -9, no launch error to report), or the launch raises.
            leader.proc.wait(timeout=nodes.NODE_READY_DEADLINE)
            failed_at = time.monotonic()
            self.assertNotEqual(leader.proc.returncode, 0, leader.log_tail())
            clean = self.assert_failed_and_clean(leader, failed_at)
            bind_error = next(
                (ln for ln in leader.log_text().splitlines() if "Address already in use" in ln),
                "",
            )
            self.assertIn(f":{group.kv_base}", bind_error, leader.log_tail())
            self.assertNotIn("is SERVING", leader.log_text())
            report_fault(
                "the KV-events port of rank 0 already taken",
                f"exit {leader.proc.returncode}: {bind_error.strip()[-120:]}",
                clean,
            )

    def test_follower_scheduler_killed_as_it_starts(self):
        group = EngineGroup(2, TP2)
        launch = group.launch(1, env={FAULT_ENV: "kill_at_start"})
        with nodes.running(launch, names=["follower"], log_dir=self.workdir) as (follower,):
            event = follower.ready()
            failed_at = time.monotonic()
            self.assertEqual(event["event"], "error", follower.log_tail())
            self.assertRegex(event["error"], r"died during initialization \(exit code: -9\)")
            clean = self.assert_failed_and_clean(follower, failed_at)
            report_fault(
                "follower scheduler SIGKILLed as it starts",
                f"exit {follower.proc.returncode}: {event['error'][:120]}",
                clean,
            )

    def test_follower_scheduler_killed_between_ready_and_server_start(self):
        group = EngineGroup(2, TP2)
        launches = [group.launch(0), group.launch(1, env={FAULT_ENV: "kill_after_ready"})]
        with nodes.running(*launches, roles=[None, "blocking-follower"],
                           log_dir=self.workdir) as (_leader, follower):  # fmt: skip
            event = follower.ready()
            failed_at = time.monotonic()
            self.assertEqual(event["event"], "error", follower.log_tail())
            self.assertRegex(
                event["error"], r"scheduler process \d+ exited before the follower metadata", event
            )
            clean = self.assert_failed_and_clean(follower, failed_at)
            self.assertNotIn("is SERVING", follower.log_text())
            report_fault(
                "follower scheduler SIGKILLed between ready and the follower server's start",
                f"exit {follower.proc.returncode}: {event['error'][:160]}",
                clean,
            )

    def test_leader_scheduler_killed_while_serving(self):
        group = EngineGroup(1, ["--tp", "1"])
        dump = self.workdir / "leader-sidecar"
        launch = group.launch(0, sidecar=DUMP_PROVIDER, sidecar_args=["--dump", str(dump)])
        with nodes.running(launch, names=["leader"], log_dir=self.workdir) as (leader,):
            leader.expect_ready()
            if not differences.differs(differences.PLUGIN_LOG_LINES):
                # The line the bad-switch test expects absent is there in a launch that starts.
                self.assertIn("node launch incarnation", leader.log_text())
            path = nodes.wait_for(
                lambda: sorted(dump.parent.glob(f"{dump.name}.*[0-9].json")),
                240,
                "the leader sidecar to start",
            )[0]
            provider = json.loads(path.read_text())["pid"]
            # The scheduler is the process listening on the KV-events port.
            scheduler = listener_pid(group.kv_base, nodes.pids_with_tag(leader.tag))
            self.assertIsNotNone(scheduler, "no process of the node listens on the KV port")
            os.kill(scheduler, signal.SIGKILL)
            killed_at = time.monotonic()
            clean = self.assert_failed_and_clean(leader, killed_at)
            self.assertFalse(alive(provider))
            crashed = next(
                (line for line in leader.log_text().splitlines() if f"pid={scheduler}" in line),
                "",
            )
            self.assertIn("crashed", crashed, leader.log_tail())
            report_fault(
                "leader scheduler SIGKILLed while serving (with a --sidecar)",
                f"exit {leader.proc.returncode}: {crashed.strip()[-140:]}",
                clean,
            )

    def test_leader_sidecar_crash_loop_exhausts_the_restart_budget(self):
        group = EngineGroup(1, ["--tp", "1"])
        sidecar_args = [
            "--sidecar-restart", "on-failure",
            "--sidecar-max-restarts", "2",
            "--sidecar-restart-window", "120",
        ]  # fmt: skip
        launch = group.launch(0, sidecar=CRASHING_PROVIDER, sidecar_args=sidecar_args)
        with nodes.running(launch, names=["leader"], log_dir=self.workdir) as (leader,):
            started = time.monotonic()
            leader.proc.wait(timeout=300)
            exited = time.monotonic()
            self.assertNotEqual(leader.proc.returncode, 0)
            log = leader.log_text()
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
