"""Node-local metadata through SGLang's real launch code and real schedulers.

CPU-only: SGLang's real schedulers on the CPU test platform (``cpu_platform/``) with the tiny
config-only model, every node in its own process (``overlay_harness.node_process``) with this
plugin loaded by SGLang's plugin framework (``SGLANG_PLUGINS=sidecar_overlay``). The leader is
``launch_server`` itself (HTTP, tokenizer manager, detokenizer, native gRPC); a follower runs
SGLang's Engine-API follower branch. Each node of a two-node group is its own host
(``overlay_harness.netns``). Live batches come from real requests pinned to each rank.

Scenarios: a single node with TP 2 lists only its attention-TP rank 0's publisher, and later
calls get the same reply, which the plugin's leader builds once per launch and logs once (the
series builds it per call and has no such line, ``patches/DIFFERENCES.md`` #2); a follower whose
metadata port is already taken fails its launch naming the address and leaves no scheduler
behind. Ordinary DP 2 through the real DP controller is deployment 1,
``contract/test_ordinary_dp_aggregate.py``; the two-node attention-DP group is
``contract/test_two_node_group.py``; the TP-only follower without a publisher is
``contract/test_relaunch_incarnation.py``'s first launch.
"""

import time
import unittest

from overlay_harness import nodes
from overlay_harness.checks import NodeInfoChecks, report_fault, report_launch
from overlay_harness.group import EngineGroup
from overlay_harness.testcase import NodesTestCase
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=120, suite="base-a-test-cpu")


class TestFollowerMetadata(NodesTestCase, NodeInfoChecks):
    def test_single_node_tp2_lists_the_attn_tp_rank0_publisher(self):
        group = EngineGroup(1, ["--tp", "2"])
        began = time.monotonic()
        with nodes.running(group.launch(0), log_dir=self.workdir) as (leader,):
            leader.expect_ready()
            report_launch("one node, --tp 2", [leader], began)
            info = leader.server_info()
            self.assert_node_info(info, group, 0, [0])
            self.assertEqual(info["kv_event_rank_space"]["size"], 1)
            self.assert_group_sources([leader], [info])
            self.assert_reply_built_once(leader, info)

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
