"""A relaunched group: every node reports a new incarnation and the same rank space.

CPU-only: SGLang's real schedulers on the CPU test platform, a two-node TP 2 group (no DP
attention: one scheduler per node, one publisher, on the leader's attention-TP rank 0), each
node its own host, launched twice. A consumer keys its view of a node by ``incarnation.id``:
a new id says the publishers restarted (sequence numbers from 0, replay buffers empty), not
that messages were lost; within a launch it never changes.

On 0.5.23 the leader also serves upstream's ``WatchEngineState``, whose snapshots carry an
``instance_id`` (a Unix time in ns taken when the native gRPC server starts) and embed the
server info: in every snapshot the two identities are paired (the embedded ``incarnation`` is
``GetServerInfo``'s), the instance id stays the same across a revision change (pause, then
continue generation) and is new, with a new incarnation, after the relaunch.

The first launch also shows the follower that owns no publisher: it answers ``[]`` (valid:
"this node owns no publisher"), and NVIDIA Dynamo's released sidecar, asked for with
``--sidecar dynamo.sglang.sidecar --sidecar-on-followers``, never starts there. The second
launch drops ``--sidecar-on-followers``: the follower logs that the sidecar runs on the leader
only, and starts none. Its follower is ``launch_server`` itself (SGLang's blocking follower
branch), and it ends with the follower's scheduler SIGKILLed while the follower serves: its
health goes SERVING, NOT_SERVING, then the server closes; no local scheduler is left to send
SGLang's SIGQUIT, so SGLang's follower branch would log the exit and return 0, and the overlay
fails the node naming the scheduler and the signal, with no process of the node left (a row
of the fault table, beside ``faults/test_launch_faults.py``'s).
"""

import re
import time
import unittest

import jsonschema
from overlay_harness import dynamo, nodes, probes
from overlay_harness.checks import NodeInfoChecks, report_fault, report_launch
from overlay_harness.group import EngineGroup
from overlay_harness.testcase import NodesTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases
from sglang_sidecar_overlay.contract import schema
from sglang_sidecar_overlay.contract.incarnation import CONTRACT_VERSION

register_cpu_ci(est_time=150, suite="base-a-test-cpu")

TP2 = ["--tp", "2"]
CONSUMER_ARGS = ["--sidecar-on-followers", "--grpc-endpoint", "unused"]
# Upstream's WatchEngineState snapshot layout, checked where it exists (0.5.23 on).
RELEASE = tuple(
    int(part)
    for part in releases.release_of(releases.installed_sglang_version() or "0.0.0").split(".")
)
WATCH_ENGINE_STATE = RELEASE >= (0, 5, 23)
REVISION_DEADLINE = 30.0
CLEAN_DEADLINE = 90.0
# Logged by a follower given --sidecar without --sidecar-on-followers (the series capitalizes).
LEADER_ONLY = f"--sidecar {dynamo.DYNAMO} runs on the leader only"


class TestRelaunchIncarnation(NodesTestCase, NodeInfoChecks):
    def launch_group(self, group: EngineGroup, last: bool) -> tuple[list[dict], float, float]:
        """Launch both nodes, check them, read their infos; (infos, launch began, ready at).
        On 0.5.23 the leader's ``WatchEngineState`` instance id goes to ``self.instances``."""
        # The relaunch drops --sidecar-on-followers: the follower says its sidecar is the
        # leader's only.
        follower_args = CONSUMER_ARGS if not last else CONSUMER_ARGS[1:]
        launches = [
            group.launch(0),
            group.launch(1, sidecar=dynamo.DYNAMO, sidecar_args=follower_args),
        ]
        roles = [None, "blocking-follower" if last else None]
        began = time.time()
        launched = time.monotonic()
        with nodes.running(*launches, roles=roles, log_dir=self.workdir) as started:
            started[0].expect_ready()
            if last:
                started[1].wait_serving()
            else:
                started[1].expect_ready()
            report_launch("two nodes, TP 2", started, launched)
            ready_at = time.time()
            infos = [node.server_info() for node in started]
            for rank, info in enumerate(infos):
                self.assert_node_info(info, group, rank, [[0], []][rank])
                # Asked again during the same launch: the same incarnation.
                self.assertEqual(started[rank].server_info()["incarnation"], info["incarnation"])
            if WATCH_ENGINE_STATE:
                self.instances.append(self.paired_snapshot(started[0], infos[0]))
                if not last:
                    self.assert_instance_id_survives_a_revision(started[0], infos[0])
            log = started[1].log_text()
            self.assertNotIn("follower sidecar", log)
            if not last:
                self.assert_group_sources(started, infos)
                self.assertIn("owns no KV-event publisher", log)
                self.assertNotIn(LEADER_ONLY, log.lower())
            else:
                self.assertIn(LEADER_ONLY, log.lower())
                self.assertNotIn("owns no KV-event publisher", log)
                self.assert_scheduler_death_fails_the_follower(started[1])
        return infos, began, ready_at

    def assert_scheduler_death_fails_the_follower(self, follower: nodes.Node) -> None:
        (scheduler,), killed_at = self.assert_follower_lifecycle(follower)
        event = follower.ready(timeout=CLEAN_DEADLINE)
        self.assertEqual(event["event"], "error", event)
        self.assertIn(f"scheduler process {scheduler} (signal SIGKILL)", event["error"])
        follower.proc.wait(timeout=CLEAN_DEADLINE)
        self.assertNotEqual(follower.proc.returncode, 0, follower.log_tail())
        follower.wait_gone(CLEAN_DEADLINE)
        report_fault(
            "the follower's scheduler SIGKILLed while the follower serves",
            f"exit {follower.proc.returncode}: {event['error'][:160]}",
            time.monotonic() - killed_at,
        )

    def paired_snapshot(self, leader: nodes.Node, info: dict) -> int:
        """The leader's current ``WatchEngineState`` snapshot embeds this launch's incarnation;
        its instance id, a Unix time in ns after the launch began."""
        snapshot = leader.inside(probes.engine_state, leader.grpc_port, leader.address)
        self.assertEqual(snapshot["server_info"]["incarnation"], info["incarnation"])
        instance = snapshot["instance_id"]
        self.assertLess(info["incarnation"]["started_at"], instance / 1e9)
        self.assertLess(instance / 1e9, time.time())
        return instance

    def assert_instance_id_survives_a_revision(self, leader: nodes.Node, info: dict) -> None:
        before = leader.inside(probes.engine_state, leader.grpc_port, leader.address)
        for path in ("/pause_generation", "/continue_generation"):
            self.assertEqual(leader.inside(probes.http_post, leader.http_port, leader.address,
                                           path), 200)  # fmt: skip
        after = nodes.wait_for(
            lambda: (s := leader.inside(probes.engine_state, leader.grpc_port, leader.address))[
                "revision"
            ]
            > before["revision"]
            and s,
            REVISION_DEADLINE,
            "pause and continue to change the revision",
        )
        self.assertEqual(after["instance_id"], before["instance_id"])
        self.assertEqual(after["server_info"]["incarnation"], info["incarnation"])

    def test_relaunched_nodes_have_new_incarnations_and_the_same_rank_space(self):
        group = EngineGroup(2, TP2)
        self.instances: list[int] = []
        first, began_1, ready_1 = self.launch_group(group, last=False)
        second, began_2, ready_2 = self.launch_group(group, last=True)
        validator = jsonschema.Draft202012Validator(schema.load_schema())
        for infos, began, ready in ((first, began_1, ready_1), (second, began_2, ready_2)):
            for info in infos:
                validator.validate(info)
                self.assertEqual(info["contract_version"], CONTRACT_VERSION)
                self.assertRegex(info["incarnation"]["id"], re.compile(r"^[0-9a-f]{32}$"))
                # Chosen while the node launched, before it was ready.
                self.assertGreaterEqual(info["incarnation"]["started_at"], began)
                self.assertLessEqual(info["incarnation"]["started_at"], ready)
                self.assertEqual({s["encoding"] for s in info["kv_event_sources"]} - {"msgpack"},
                                 set())  # fmt: skip
        for node_rank in (0, 1):
            before, after = first[node_rank], second[node_rank]
            self.assertNotEqual(before["incarnation"]["id"], after["incarnation"]["id"])
            self.assertGreater(
                after["incarnation"]["started_at"], before["incarnation"]["started_at"]
            )
            self.assertEqual(before["kv_event_rank_space"], after["kv_event_rank_space"])
        self.assertNotEqual(first[0]["incarnation"]["id"], first[1]["incarnation"]["id"])
        if WATCH_ENGINE_STATE:
            self.assertGreater(self.instances[1], self.instances[0])
        self.assertEqual(first[0]["kv_event_rank_space"]["local_ranks"], [0])
        self.assertEqual(first[1]["kv_event_rank_space"]["local_ranks"], [])


if __name__ == "__main__":
    unittest.main()
