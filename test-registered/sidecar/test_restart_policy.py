"""The ``--sidecar`` restart policy through SGLang's real launch path, on the leader.

CPU-only: SGLang's real scheduler on the CPU test platform. The leader runs
``http_server.launch_server`` itself (``overlay_harness.node_process``): uvicorn and the
FastAPI lifespan that binds the native gRPC server and then calls ``start_sidecar``, which the
plugin replaces with its supervisor. The provider is ``overlay_harness.providers.kv_probe``,
which reports each step to a JSON-lines file; the restart options travel in
``--sidecar-args``, as an operator writes them, and the supervisor takes them out before the
provider sees its argv.

With ``--sidecar-restart on-failure --sidecar-max-restarts 1``: a killed provider is started
again (a new process that reads the node's metadata again) while the node keeps serving; killed
once more, the budget is spent and the node goes down the way upstream's watchdog brings it down
(SIGQUIT). That last kill is the path a killed provider takes under the default policy
(``never``), whose refusal to restart the supervisor's unit tests show
(``tests/sidecar/test_lifecycle.py``); it has no launch of its own. The crash-loop variant (a
provider that exits at once, every time) is in ``faults/test_launch_faults.py``.
"""

import contextlib
import json
import os
import signal
import sys
import time
import unittest
import uuid
from pathlib import Path

from overlay_harness import nodes
from overlay_harness.group import EngineGroup
from overlay_harness.testcase import NodesTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=22, suite="base-a-test-cpu")

RELEASE = releases.installed_sglang_version() or ""
PROVIDER = "overlay_harness.providers.kv_probe"
RESTART = ["--sidecar-restart", "on-failure", "--sidecar-max-restarts", "1"]
EVENT_DEADLINE = 120.0
STOP_DEADLINE = 90.0


def read_report(path: Path) -> list[dict]:
    with contextlib.suppress(OSError):
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return []


def provider_steps(path: Path, pid: int) -> list[str]:
    return [r["step"] for r in read_report(path) if r["pid"] == pid]


class TestRestartPolicy(NodesTestCase):
    def test_restart_policy_restarts_then_brings_the_node_down(self):
        group = EngineGroup(1, ["--tp", "1"])
        report = self.workdir / f"report-{uuid.uuid4().hex}.jsonl"
        launch = group.launch(0, sidecar=PROVIDER, sidecar_args=["--report", str(report), *RESTART])
        with nodes.running(launch, names=["leader"], log_dir=self.workdir) as (node,):
            node.expect_ready()

            def subscribed_provider(other_than: int | None = None) -> dict | None:
                if node.proc.poll() is not None:
                    raise AssertionError(f"the node exited {node.proc.returncode}")
                return next(
                    (
                        r
                        for r in read_report(report)
                        if r["step"] == "subscribed" and r["pid"] != other_than
                    ),
                    None,
                )

            first = nodes.wait_for(subscribed_provider, EVENT_DEADLINE, "the first provider")
            # The supervisor took the restart options out of the provider's argv.
            self.assertEqual(
                next(r for r in read_report(report) if r["step"] == "started")["argv"],
                ["--report", str(report)],
            )
            os.kill(first["pid"], signal.SIGKILL)
            second = nodes.wait_for(
                lambda: subscribed_provider(first["pid"]), EVENT_DEADLINE, "the restarted provider"
            )
            self.assertIsNone(node.proc.poll(), "the node went down on a restartable exit")
            # A new process that reached the node's metadata server again.
            self.assertEqual(provider_steps(report, second["pid"])[:2], ["started", "server_info"])
            self.assertEqual(node.server_info()["node_rank"], 0)

            os.kill(second["pid"], signal.SIGKILL)
            killed_at = time.monotonic()
            node.proc.wait(timeout=STOP_DEADLINE)
            sys.stderr.write(
                f"[{RELEASE}] node down {time.monotonic() - killed_at:.2f} s after the provider "
                "was killed with no restart left\n"
            )
            self.assertNotEqual(node.proc.returncode, 0)
            log = node.log_text()
            self.assertEqual(log.count("restarting in"), 1, node.log_tail())
            self.assertIn("1 restarts within 300 s, giving up", log)
            self.assertIn("triggering SIGQUIT", log)
            node.wait_gone()


if __name__ == "__main__":
    unittest.main()
