"""Node-local metadata on every node of an engine group, through SGLang's real launch code.

CPU-only. The only stand-in is the model-running part of each scheduler
(``overlay_harness.standin``): a process SGLang's own launch code spawns (``Engine`` directly
or through the DP controller), that answers the real ready handshake and owns a real
``ZmqEventPublisher`` made by SGLang's factory with SGLang's rank selection. Every node runs
in its own process (``overlay_harness.node``) with this plugin loaded by SGLang's plugin
framework (``SGLANG_PLUGINS=sidecar_overlay``).

The leader runs ``Engine._launch_subprocesses`` with SGLang's real tokenizer manager and
detokenizer (``--skip-tokenizer-init``), then the native gRPC server that the HTTP lifespan
starts (``_start_native_grpc_server_for_runtime`` over ``RuntimeHandle``); its HTTP frontend
is exercised in ``test_sidecar_launch``. Each node of a two-node group is its own host
(``overlay_harness.netns``), started leader first; every probe runs on the node it asks. The
two-node attention-DP group is ``contract/test_attention_dp_group.py``, launched once for
every check that reads it. The TP-only follower is launched with the released Dynamo consumer
as ``--sidecar`` and ``--sidecar-on-followers``: it owns no publisher, so the consumer never
starts there.
"""

import time
import unittest
from collections.abc import Callable

from overlay_harness import cluster
from overlay_harness.checks import NodeInfoChecks, report_fault
from overlay_harness.cluster import EngineGroup
from overlay_harness.dynamo import DYNAMO
from overlay_harness.testcase import TinyModelTestCase
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=99, suite="base-a-test-cpu")


class TestFollowerMetadata(TinyModelTestCase, NodeInfoChecks):
    def run_group(
        self,
        group: EngineGroup,
        expected_ranks: list[list[int]],
        follower_sidecar: tuple[str, list[str]] | None = None,
        then: Callable[[list[cluster.Node]], None] | None = None,
    ):
        """Launch ``group`` (followers with ``follower_sidecar``: module and its arguments),
        check every node's metadata, then run ``then`` on the live nodes."""
        arg_lists = [group.for_node(0)]
        arg_lists += [group.for_node(r, *(follower_sidecar or ())) for r in range(1, group.nnodes)]
        with cluster.nodes(*arg_lists) as started:
            events = [node.ready() for node in started]
            for node, event in zip(started, events, strict=True):
                self.assertEqual(event["event"], "ready", f"{event}\n{node.log_tail()}")
            infos = [node.server_info() for node in started]
            for rank, info in enumerate(infos):
                self.assert_node_info(info, group, rank, expected_ranks[rank])
            self.assert_group_sources(started, infos)
            for rank in range(1, group.nnodes):
                self.assert_follower_lifecycle(started[rank])
            if then is not None:
                then(started)
        return infos

    # --- scenarios -----------------------------------------------------------------------------

    def test_single_node_tp2_lists_the_attn_tp_rank0_publisher(self):
        group = EngineGroup(self.model, 1, ["--tp", "2"])
        (info,) = self.run_group(group, [[0]])
        self.assertEqual(info["kv_event_rank_space"]["size"], 1)

    def test_ordinary_dp2_tp1_through_the_dp_controller(self):
        # SGLang refuses ordinary DP across nodes ("multi-node data parallel is not supported
        # unless dp attention"), so the DP-controller path runs on one node: both replicas'
        # sources must come through the controller (which drops unknown ready keys before
        # 0.5.22) with distinct ranks and ports.
        group = EngineGroup(self.model, 1, ["--tp", "1", "--dp", "2"])
        (info,) = self.run_group(group, [[0, 1]])
        self.assertEqual(info["kv_event_rank_space"]["size"], 2)

    def test_follower_without_publisher_answers_empty_list_and_gets_no_sidecar(self):
        # Ordinary DP across nodes is refused by SGLang itself ("multi-node data parallel is
        # not supported unless dp attention"); what a two-node group without DP attention
        # gives a follower is no publisher at all (tp_rank 1), where the released consumer
        # asked for with --sidecar-on-followers must not run.
        group = EngineGroup(self.model, 2, ["--tp", "2"])
        consumer = (DYNAMO, ["--sidecar-on-followers", "--grpc-endpoint", "unused"])

        def no_sidecar(started: list[cluster.Node]) -> None:
            log = started[1].log_path.read_text(errors="replace")
            self.assertIn("owns no KV-event publisher", log)
            self.assertNotIn("follower sidecar", log)

        self.run_group(group, [[0], []], consumer, then=no_sidecar)

    def test_follower_port_taken_fails_launch_and_leaves_no_scheduler(self):
        group = EngineGroup(self.model, 2, ["--tp", "2"])
        with (
            cluster.holding_port(group, 1, group.grpc_ports[1]),
            cluster.nodes(group.for_node(1)) as (follower,),
        ):
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
