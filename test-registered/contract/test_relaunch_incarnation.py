"""A relaunched node reports a new incarnation and the same rank space, through SGLang's real
launch code (``overlay_harness``: real ``Engine`` launch, stand-in model runner, real
``ZmqEventPublisher``s, the plugin loaded by SGLang's plugin framework).

A consumer keys its view of a node by ``incarnation.id``: a new id says the publishers
restarted (sequence numbers from 0, replay buffers empty), not that messages were lost.
"""

import re
import time
import unittest

import jsonschema
from overlay_harness import cluster
from overlay_harness.cluster import EngineGroup
from overlay_harness.testcase import TinyModelTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay.contract import schema
from sglang_sidecar_overlay.contract.incarnation import CONTRACT_VERSION

register_cpu_ci(est_time=60, suite="base-a-test-cpu")


class TestRelaunchIncarnation(TinyModelTestCase):
    def launch_once(self, group: EngineGroup) -> tuple[dict, float, float]:
        """Launch the node, read its server info, stop it; (info, launch began, ready at)."""
        began = time.time()
        with cluster.nodes(group.for_node(0)) as (node,):
            node.expect_ready()
            ready_at = time.time()
            info = node.server_info()
            # Asked again during the same launch: the same incarnation.
            self.assertEqual(node.server_info()["incarnation"], info["incarnation"])
        return info, began, ready_at

    def test_relaunched_node_has_a_new_incarnation_and_the_same_rank_space(self):
        # Ordinary DP 2 on one node: both publishers come through the DP controller.
        group = EngineGroup(self.model, 1, ["--tp", "1", "--dp", "2"])
        first, began_1, ready_1 = self.launch_once(group)
        second, began_2, ready_2 = self.launch_once(group)
        validator = jsonschema.Draft202012Validator(schema.load_schema())
        for info, began, ready in ((first, began_1, ready_1), (second, began_2, ready_2)):
            validator.validate(info)
            self.assertEqual(info["contract_version"], CONTRACT_VERSION)
            self.assertRegex(info["incarnation"]["id"], re.compile(r"^[0-9a-f]{32}$"))
            # Chosen while the node launched, before it was ready.
            self.assertGreaterEqual(info["incarnation"]["started_at"], began)
            self.assertLessEqual(info["incarnation"]["started_at"], ready)
            self.assertEqual({s["encoding"] for s in info["kv_event_sources"]}, {"msgpack"})
        self.assertNotEqual(first["incarnation"]["id"], second["incarnation"]["id"])
        self.assertGreater(second["incarnation"]["started_at"], first["incarnation"]["started_at"])
        self.assertEqual(first["kv_event_rank_space"], second["kv_event_rank_space"])
        self.assertEqual(first["kv_event_rank_space"]["local_ranks"], [0, 1])
        strip = lambda info: [  # noqa: E731
            {k: v for k, v in s.items() if k != "replay_endpoint"} for s in info["kv_event_sources"]
        ]
        self.assertEqual(strip(first), strip(second))


if __name__ == "__main__":
    unittest.main()
