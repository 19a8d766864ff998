"""``probe --group`` on a real two-node engine group launched through SGLang's launch code.

Attention DP 2 over two nodes (TP 2, one scheduler per node in this CPU harness' layout):
rank 0 on the leader, rank 1 on the follower, each its own host, started follower first. The
probe runs on the leader's host, as a router on one host of the cluster would, and reaches the
follower over the bridge. The group check passes with the addresses in any order; it fails by
name when the follower is not given (its rank is expected there) and when the follower's
schedulers are gone (its health turns NOT_SERVING).
"""

import json
import subprocess
import sys
import unittest

from overlay_harness import cluster
from overlay_harness.cluster import EngineGroup
from overlay_harness.testcase import TinyModelTestCase
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=42, suite="base-a-test-cpu")


def probe_group(on: cluster.Node, *targets: str) -> tuple[int, dict, str]:
    """The installed CLI's ``probe --group`` run on ``on``'s host (JSON and human output);
    (exit code, JSON, text)."""
    command = [sys.executable, "-m", "sglang_sidecar_overlay", "probe", "--group", *targets]
    as_json = subprocess.run(
        on.command([*command, "--json"]), capture_output=True, text=True, timeout=120
    )
    text = subprocess.run(on.command(command), capture_output=True, text=True, timeout=120)
    assert as_json.returncode == text.returncode, (as_json.stdout, text.stdout)
    return as_json.returncode, json.loads(as_json.stdout), text.stdout


def group_errors(report: dict) -> dict:
    return {c["field"]: c["message"] for c in report["checks"] if c["level"] == "error"}


class TestGroupProbe(TinyModelTestCase):
    def test_two_node_attention_dp_group(self):
        group = EngineGroup(self.model, 2, ["--tp", "2", "--dp", "2", "--enable-dp-attention"])
        leader = f"{group.address(0)}:{group.grpc_ports[0]}"
        follower = f"{group.address(1)}:{group.grpc_ports[1]}"
        with cluster.nodes(group.for_node(1), group.for_node(0)) as (follower_node, leader_node):
            for node in (follower_node, leader_node):
                node.expect_ready()

            code, report, text = probe_group(leader_node, follower, leader)
            self.assertEqual(code, 0, text)
            self.assertTrue(report["ok"], text)
            self.assertEqual(
                report["ranks"],
                {
                    "0": [{"node_rank": 0, "target": leader}],
                    "1": [{"node_rank": 1, "target": follower}],
                },
            )
            self.assertIn(f"node_rank 1  {follower}  ranks 1  health SERVING", text)
            print(f"--- probe --group {follower} {leader}\n{text}", file=sys.stderr)

            code, report, text = probe_group(leader_node, leader)
            self.assertEqual(code, 1, text)
            errors = group_errors(report)
            self.assertEqual(
                errors["rank 1"],
                "no node advertises it; expected on node_rank 1 (not given): "
                "is its publisher missing?",
            )
            self.assertIn("nnodes=2 but 1 address(es) were given", errors["nnodes"])
            print(f"--- probe --group {leader}\n{text}", file=sys.stderr)

            for pid in follower_node.event["pids"]:
                cluster.os.kill(pid, cluster.signal.SIGKILL)
            cluster.wait_for(
                lambda: follower_node.health() != cluster.SERVING,
                120,
                "the follower to stop serving",
            )
            code, report, text = probe_group(leader_node, leader, follower)
            self.assertEqual(code, 1, text)
            errors = group_errors(report)
            # NOT_SERVING while it shuts down, or gone already: either way named.
            self.assertTrue(
                errors.get(f"node_rank 1 ({follower})", "").startswith("fails its own probe")
                or errors.get(follower, "").startswith("not probed: "),
                errors,
            )
            print(f"--- probe --group {leader} {follower} (follower down)\n{text}", file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
