"""One two-node attention-DP group, launched once, read by everything that consumes the contract.

Real: SGLang's launch code for ``--tp 2 --dp 2 --enable-dp-attention`` over two nodes (one
scheduler per node in this CPU harness' layout: rank 0 on the leader, rank 1 on the follower),
each scheduler's ``ZmqEventPublisher`` made by SGLang's own factory from the node's
``--kv-events-config`` (with a replay ROUTER, ``overlay_harness.cluster.EngineGroup``), the
plugin loaded by SGLang's plugin framework, each node's native gRPC ``GetServerInfo``. The
stand-in is only the model-running part of the scheduler (``overlay_harness.standin``), which
publishes a real event batch every half second. Each node is its own host
(``overlay_harness.netns``); the follower starts first. The ``dp_size`` switch is off (both
names), as by default.

In order (the last one takes the follower down):
1. each node lists its own rank's source on loopback; each advertised endpoint delivers a live
   batch on its own node and refuses a connection from the other node;
2. a consumer on each source's node, joining late, replays from a sequence number through the
   advertised ``replay_endpoint``: from the requested number, no gap, up to the last live batch
   it saw, the same bytes as the live messages, each a ``KVEventBatch`` stamped with the rank;
3. ``sglang-sidecar-overlay probe`` on the follower: on 0.5.22+ (``dp_size=1`` for attention DP)
   it says why a released consumer rejects the follower; before 0.5.22 it has nothing to say;
4. ``probe --group`` on the leader's host, as a router on one host of the cluster: passes with
   the addresses in any order, reaching the follower over the bridge; fails by name when the
   follower is not given (its rank is expected there);
5. the follower's schedulers killed: its health goes SERVING, NOT_SERVING, then the server
   closes (Watch), and ``probe --group`` names the follower.
"""

import contextlib
import json
import os
import subprocess
import sys
import unittest
from unittest import mock

import msgspec
from overlay_harness import cluster, differences, probes
from overlay_harness.checks import NodeInfoChecks
from overlay_harness.cluster import EngineGroup
from overlay_harness.dynamo import LEGACY_ENV, UPSTREAM_LEGACY_ENV
from overlay_harness.testcase import TinyModelTestCase
from sglang.srt.disaggregation.kv_events import KVEventBatch
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=41, suite="base-a-test-cpu")

RELEASE = releases.installed_sglang_version() or ""
ATTENTION_DP_REPORTS_DP_SIZE_1 = releases.adapter_for(RELEASE or "0") == (
    "sglang_sidecar_overlay.adapters.v0_5_22"
)
LIVE_BATCHES = 4
# The stand-in publishes every 0.5 s; the machine may be loaded.
LIVE_DEADLINE = 90.0
REPLAY_DEADLINE = 60.0
# How far before the first live batch the consumer asks the replay to start.
REPLAY_LEAD = 3


def overlay_cli(on: cluster.Node, *args: str) -> subprocess.CompletedProcess:
    """The installed ``sglang-sidecar-overlay`` CLI, run on ``on``'s host."""
    command = [sys.executable, "-m", "sglang_sidecar_overlay", *args]
    return subprocess.run(on.command(command), capture_output=True, text=True, timeout=120)


def probe_group(on: cluster.Node, *targets: str) -> tuple[int, dict, str]:
    """``probe --group`` on ``on``'s host (JSON and human output); (exit code, JSON, text)."""
    as_json = overlay_cli(on, "probe", "--group", *targets, "--json")
    text = overlay_cli(on, "probe", "--group", *targets)
    assert as_json.returncode == text.returncode, (as_json.stdout, text.stdout)
    return as_json.returncode, json.loads(as_json.stdout), text.stdout


def group_errors(report: dict) -> dict:
    return {c["field"]: c["message"] for c in report["checks"] if c["level"] == "error"}


class TestAttentionDpGroup(TinyModelTestCase, NodeInfoChecks):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._nodes = contextlib.ExitStack()
        try:
            cls.group = EngineGroup(
                cls.model, 2, ["--tp", "2", "--dp", "2", "--enable-dp-attention"]
            )
            cls._nodes.enter_context(
                mock.patch.dict(os.environ, {LEGACY_ENV: "0", UPSTREAM_LEGACY_ENV: "0"})
            )
            cls.follower, cls.leader = cls._nodes.enter_context(
                cluster.nodes(cls.group.for_node(1), cls.group.for_node(0))
            )
            for node in (cls.follower, cls.leader):
                node.expect_ready()
            cls.infos = [node.server_info() for node in (cls.leader, cls.follower)]
        except BaseException:
            cls._nodes.close()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            cls._nodes.close()
        finally:
            super().tearDownClass()

    def target(self, node_rank: int) -> str:
        return f"{self.group.address(node_rank)}:{self.group.grpc_ports[node_rank]}"

    def test_1_each_node_lists_its_own_source_reachable_only_there(self):
        for node_rank, info in enumerate(self.infos):
            self.assert_node_info(info, self.group, node_rank, [node_rank])
            self.assertEqual(info["kv_event_rank_space"]["size"], 2)
        self.assert_group_sources([self.leader, self.follower], self.infos)

    def test_2_replay_from_a_sequence_number(self):
        for node, info in zip((self.leader, self.follower), self.infos, strict=True):
            for source in info["kv_event_sources"]:
                rank = source["dp_rank"]
                # Node-local: the wildcard bind of rank r's ROUTER, dialable on loopback.
                self.assertEqual(
                    source.get("replay_endpoint"),
                    f"tcp://127.0.0.1:{self.group.replay_base + rank}",
                    source,
                )
                self.assert_replays(node, source)

    def assert_replays(self, node: cluster.Node, source: dict):
        """As a consumer on ``node`` (the source's own host) joining late would."""
        rank = source["dp_rank"]
        pairs = node.inside(
            probes.live_batches,
            source["endpoint"],
            source["topic"],
            LIVE_BATCHES,
            REPLAY_LEAD,
            LIVE_DEADLINE,
        )
        live = {seq: bytes.fromhex(payload) for seq, payload in pairs}
        first = min(live)
        # Contiguous live numbers: the replay below must reproduce each of them.
        self.assertEqual(sorted(live), list(range(first, first + LIVE_BATCHES)), sorted(live))
        start = first - REPLAY_LEAD
        replayed = node.inside(probes.replay, source["replay_endpoint"], start, REPLAY_DEADLINE)
        seqs = [seq for _topic, seq, _payload in replayed]
        self.assertTrue(seqs, f"rank {rank}: empty replay from {start}")
        self.assertEqual(seqs[0], start, f"rank {rank}: replay from {start} began at {seqs[0]}")
        self.assertEqual(seqs, list(range(start, start + len(seqs))), f"rank {rank}: {seqs}")
        self.assertLessEqual(max(live), seqs[-1], f"rank {rank}: replay ends before live did")
        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        for topic, seq, payload_hex in replayed:
            payload = bytes.fromhex(payload_hex)
            if topic is not None:  # before 0.5.22 a replayed message has no topic frame
                self.assertEqual(topic, source["topic"])
            if seq in live:
                self.assertEqual(payload, live[seq], f"rank {rank}: seq {seq} replayed differs")
            batch = decoder.decode(payload)
            self.assertEqual(batch.attn_dp_rank, rank, f"rank {rank}: seq {seq} stamp")
            self.assertTrue(batch.events, f"rank {rank}: seq {seq} has no events")
        print(
            f"rank {rank}: live {sorted(live)}, replay from {start} via "
            f"{source['replay_endpoint']}: {seqs[0]}..{seqs[-1]} ({len(seqs)} batches)"
        )

    def test_3_probe_warns_of_dp_size_1_only_where_reported(self):
        probe = overlay_cli(self.follower, "probe", self.target(1), "--timeout", "10")
        output = probe.stdout + probe.stderr
        if not ATTENTION_DP_REPORTS_DP_SIZE_1:
            self.assertNotIn("top-level dp_size", output, output)
            self.assertEqual(probe.returncode, 0, output)
            return
        self.assertIn("top-level dp_size 1", output, output)
        warning = next(line for line in output.splitlines() if "dp_size 1" in line)
        sys.stderr.write(f"[{RELEASE}] probe, switch off: {warning}\n")

    def test_4_group_probe_from_the_leaders_host(self):
        leader, follower = self.target(0), self.target(1)
        code, report, text = probe_group(self.leader, follower, leader)
        self.assertEqual(code, 0, text)
        self.assertTrue(report["ok"], text)
        self.assertEqual(
            report["ranks"],
            {
                "0": [{"node_rank": 0, "target": leader}],
                "1": [{"node_rank": 1, "target": follower}],
            },
        )
        health = "absent" if differences.differs(differences.FOLLOWER_HEALTH) else "SERVING"
        self.assertIn(f"node_rank 1  {follower}  ranks 1  health {health}", text)
        print(f"--- probe --group {follower} {leader}\n{text}", file=sys.stderr)

        code, report, text = probe_group(self.leader, leader)
        self.assertEqual(code, 1, text)
        errors = group_errors(report)
        self.assertEqual(
            errors["rank 1"],
            "no node advertises it; expected on node_rank 1 (not given): is its publisher missing?",
        )
        self.assertIn("nnodes=2 but 1 address(es) were given", errors["nnodes"])
        print(f"--- probe --group {leader}\n{text}", file=sys.stderr)

    def test_5_follower_down(self):
        self.assert_follower_lifecycle(self.follower)
        if differences.differs(differences.FOLLOWER_HEALTH):
            # Upstream's follower server has no health to turn and no scheduler watch: it
            # answers as before until the node stops, so there is no failure to name.
            return
        leader, follower = self.target(0), self.target(1)
        code, report, text = probe_group(self.leader, leader, follower)
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
