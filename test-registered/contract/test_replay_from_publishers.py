"""A consumer replays from a sequence number through the advertised ``replay_endpoint``.

Real: SGLang's launch code for a two-node attention-DP group (TP 2, DP 2; rank 0 on the
leader, rank 1 on the follower), each scheduler's ``ZmqEventPublisher`` made by SGLang's own
``SchedulerKvEventsPublisher`` from the node's ``--kv-events-config`` (which binds a replay
ROUTER, ``overlay_harness.cluster.EngineGroup``), the plugin loaded by SGLang's plugin framework,
each node's native gRPC ``GetServerInfo``, and ZMQ sockets on loopback: each node is its own
host, and the consumer runs on the node whose source it reads. The stand-in is only the
model-running part of the scheduler (``overlay_harness.standin``), which publishes a real event
batch every half second.

As a router that joins late would: subscribe to each advertised ``endpoint`` and note the
sequence numbers of some live batches (from ``REPLAY_LEAD`` on: the batches before it are the
ones it missed), then ask the advertised ``replay_endpoint`` (DEALER) for everything from
``REPLAY_LEAD`` batches before the first one it noted. The replay must start at the requested
number, have no gap, reach the last live batch, and carry the same bytes as the live messages it
overlaps; every batch decodes as the release's ``KVEventBatch`` stamped with the source's rank.
"""

import unittest

import msgspec
from overlay_harness import cluster, probes
from overlay_harness.cluster import EngineGroup
from overlay_harness.testcase import TinyModelTestCase
from sglang.srt.disaggregation.kv_events import KVEventBatch
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=43, suite="base-a-test-cpu")

LIVE_BATCHES = 4
# The stand-in publishes every 0.5 s; the machine may be loaded.
LIVE_DEADLINE = 90.0
REPLAY_DEADLINE = 60.0
# How far before the first live batch the consumer asks the replay to start.
REPLAY_LEAD = 3


class TestReplayFromPublishers(TinyModelTestCase):
    def assert_replays(self, node: cluster.Node, source: dict):
        """As a consumer on ``node`` (the source's own host) would."""
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
        replayed = [
            (topic, seq, bytes.fromhex(payload))
            for topic, seq, payload in node.inside(
                probes.replay, source["replay_endpoint"], start, REPLAY_DEADLINE
            )
        ]
        seqs = [seq for _topic, seq, _payload in replayed]
        self.assertTrue(seqs, f"rank {rank}: empty replay from {start}")
        self.assertEqual(seqs[0], start, f"rank {rank}: replay from {start} began at {seqs[0]}")
        self.assertEqual(seqs, list(range(start, start + len(seqs))), f"rank {rank}: {seqs}")
        self.assertLessEqual(max(live), seqs[-1], f"rank {rank}: replay ends before live did")
        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        for topic, seq, payload in replayed:
            if topic is not None:
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

    def test_two_node_attention_dp_replay_from_a_sequence_number(self):
        group = EngineGroup(self.model, 2, ["--tp", "2", "--dp", "2", "--enable-dp-attention"])
        with cluster.nodes(*(group.for_node(r) for r in range(2))) as started:
            for node in started:
                node.expect_ready()
            for node_rank, node in enumerate(started):
                info = node.server_info()
                node_sources = info["kv_event_sources"]
                self.assertEqual([s["dp_rank"] for s in node_sources], [node_rank], node_sources)
                for source in node_sources:
                    rank = source["dp_rank"]
                    self.assertIn("replay_endpoint", source, source)
                    # Node-local: the wildcard bind of rank r's ROUTER, dialable on loopback.
                    self.assertEqual(
                        source["replay_endpoint"], f"tcp://127.0.0.1:{group.replay_base + rank}"
                    )
                    self.assertEqual(source["endpoint"], f"tcp://127.0.0.1:{group.kv_base + rank}")
                    self.assert_replays(node, source)


if __name__ == "__main__":
    unittest.main()
