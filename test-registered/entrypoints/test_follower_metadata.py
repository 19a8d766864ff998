"""Node-local metadata through SGLang's real launch code and real schedulers.

CPU-only: SGLang's real schedulers on the CPU test platform (``cpu_platform/``) with the tiny
config-only model, every node in its own process (``overlay_harness.node_process``) with this
plugin loaded by SGLang's plugin framework (``SGLANG_PLUGINS=sidecar_overlay``). The leader is
``launch_server`` itself (HTTP, tokenizer manager, detokenizer, native gRPC); a follower runs
SGLang's Engine-API follower branch. Each node of a two-node group is its own host
(``overlay_harness.netns``). Live batches come from real requests pinned to each rank.

Scenarios: a single node with TP 2 lists only its attention-TP rank 0's publisher; ordinary
DP 2 through the real DP controller lists both replicas' publishers (distinct ranks and ports;
the controller drops unknown ready keys before 0.5.22); on both, later calls get the same
reply, which the plugin's leader builds once per launch and logs once (the series builds it
per call and has no such line, ``patches/DIFFERENCES.md`` #2); a follower whose metadata port
is already taken fails its launch naming the address and leaves no scheduler behind. The two-node
attention-DP group is ``contract/test_two_node_group.py``; the TP-only follower without a
publisher is ``contract/test_relaunch_incarnation.py``'s first launch.
"""

import time
import unittest

from overlay_harness import differences, nodes
from overlay_harness.checks import NodeInfoChecks, report_fault, report_launch
from overlay_harness.group import EngineGroup
from overlay_harness.testcase import NodesTestCase
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=120, suite="base-a-test-cpu")

LEADER_REPLY_BUILT = "leader GetServerInfo reply built"


class TestFollowerMetadata(NodesTestCase, NodeInfoChecks):
    def run_single_node(self, parallel: list[str], ranks: list[int]) -> dict:
        group = EngineGroup(1, parallel)
        began = time.monotonic()
        with nodes.running(group.launch(0), log_dir=self.workdir) as (leader,):
            leader.expect_ready()
            report_launch(f"one node, {' '.join(parallel)}", [leader], began)
            info = leader.server_info()
            self.assert_node_info(info, group, 0, ranks)
            self.assert_group_sources([leader], [info])
            self.assert_reply_built_once(leader, info)
        return info

    def assert_reply_built_once(self, leader: nodes.Node, info: dict):
        """The leader's reply is built at the first GetServerInfo, then served as cached text:
        later calls get the same object, and the build is logged once per launch."""
        self.assertEqual([leader.server_info() for _ in range(3)], [info] * 3)
        if not differences.differs(differences.PLUGIN_LOG_LINES):
            self.assertEqual(leader.log_text().count(LEADER_REPLY_BUILT), 1, leader.log_tail())

    def test_single_node_tp2_lists_the_attn_tp_rank0_publisher(self):
        info = self.run_single_node(["--tp", "2"], [0])
        self.assertEqual(info["kv_event_rank_space"]["size"], 1)

    def test_ordinary_dp2_tp1_through_the_dp_controller(self):
        # SGLang refuses ordinary DP across nodes ("multi-node data parallel is not supported
        # unless dp attention"), so the DP-controller path runs on one node.
        info = self.run_single_node(["--tp", "1", "--dp", "2"], [0, 1])
        self.assertEqual(info["kv_event_rank_space"]["size"], 2)

    def test_follower_port_taken_fails_launch_and_leaves_no_scheduler(self):
        group = EngineGroup(2, ["--tp", "2"])
        with (
            nodes.holding_port(group, 1, group.grpc_ports[1]),
            nodes.running(group.launch(0), group.launch(1), log_dir=self.workdir) as started,
        ):
            follower = started[1]
            event = follower.ready()
            failed_at = time.monotonic()
            self.assertEqual(event["event"], "error", follower.log_tail())
            self.assertIn(f"{group.address(1)}:{group.grpc_ports[1]}", event["error"])
            follower.proc.wait(timeout=120)
            self.assertNotEqual(follower.proc.returncode, 0)
            follower.wait_gone()
            report_fault(
                "follower metadata port already taken",
                f"exit {follower.proc.returncode}: {event['error'][:120]}",
                time.monotonic() - failed_at,
            )


if __name__ == "__main__":
    unittest.main()
