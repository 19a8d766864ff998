"""A consumer replays from a sequence number through the advertised ``replay_endpoint``.

Real: SGLang's launch code for a two-node attention-DP group (TP 2, DP 2; rank 0 on the
leader, rank 1 on the follower), each scheduler's ``ZmqEventPublisher`` made by SGLang's own
``SchedulerKvEventsPublisher`` from the node's ``--kv-events-config`` (which binds a replay
ROUTER, ``overlay_harness.cluster.EngineGroup``), the plugin loaded by SGLang's plugin framework,
each node's native gRPC ``GetServerInfo``, and ZMQ sockets on loopback. The stand-in is only the
model-running part of the scheduler (``overlay_harness.standin``), which publishes a real event
batch every half second.

As a router that joins late would: subscribe to each advertised ``endpoint`` and note the
sequence numbers of some live batches (from ``REPLAY_LEAD`` on: the batches before it are the
ones it missed), then ask the advertised ``replay_endpoint`` (DEALER) for everything from
``REPLAY_LEAD`` batches before the first one it noted. The replay must start at the requested
number, have no gap, reach the last live batch, and carry the same bytes as the live messages it
overlaps; every batch decodes as the release's ``KVEventBatch`` stamped with the source's rank.
"""

import time
import unittest
from collections.abc import Callable

import msgspec
import zmq
from overlay_harness import cluster
from overlay_harness.cluster import EngineGroup
from overlay_harness.testcase import TinyModelTestCase
from sglang.srt.disaggregation.kv_events import KVEventBatch
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=53, suite="base-a-test-cpu")

LIVE_BATCHES = 4
# The stand-in publishes every 0.5 s; the machine may be loaded.
LIVE_DEADLINE = 90.0
REPLAY_DEADLINE = 60.0
# How far before the first live batch the consumer asks the replay to start.
REPLAY_LEAD = 3
SEQ_BYTES = 8
END_SEQ = -1


def receive_before(socket: zmq.Socket, deadline: float, failure: Callable[[], str]) -> list:
    """The socket's next multipart message, or an ``AssertionError(failure())`` at
    ``deadline`` (``time.monotonic()``)."""
    while (remaining := deadline - time.monotonic()) > 0:
        if socket.poll(timeout=min(remaining, 1.0) * 1000):
            return socket.recv_multipart()
    raise AssertionError(failure())


def receive_live(context: zmq.Context, source: dict) -> dict[int, bytes]:
    """``{seq: payload}`` of the first ``LIVE_BATCHES`` live batches numbered ``REPLAY_LEAD`` or
    more on the source's topic (a subscriber may join before the first batch is published)."""
    sub = context.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, source["topic"].encode())
        sub.connect(source["endpoint"])
        seen: dict[int, bytes] = {}
        deadline = time.monotonic() + LIVE_DEADLINE
        while len(seen) < LIVE_BATCHES:
            topic, seq, payload = receive_before(
                sub,
                deadline,
                lambda: f"{len(seen)} live batch(es) from {source['endpoint']} "
                f"within {LIVE_DEADLINE:.0f} s",
            )
            if topic != source["topic"].encode():
                raise AssertionError(f"live topic {topic!r} on {source['endpoint']}")
            seq = int.from_bytes(seq, "big", signed=True)
            if seq >= REPLAY_LEAD:
                seen[seq] = payload
        return seen
    finally:
        sub.close(linger=0)


def request_replay(context: zmq.Context, replay_endpoint: str, start: int) -> list[tuple]:
    """``[(topic or None, seq, payload)]`` a DEALER gets back for ``start``, up to the end
    marker. Before SGLang 0.5.22 a replayed message has no topic frame."""
    dealer = context.socket(zmq.DEALER)
    try:
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(replay_endpoint)
        # The ROUTER reads [identity, "", start]; a DEALER adds no delimiter of its own.
        dealer.send_multipart([b"", start.to_bytes(SEQ_BYTES, "big")])
        replayed = []
        deadline = time.monotonic() + REPLAY_DEADLINE
        while True:
            frames = receive_before(
                dealer,
                deadline,
                lambda: f"no end marker from {replay_endpoint} within {REPLAY_DEADLINE:.0f} s "
                f"({len(replayed)} batch(es) replayed)",
            )
            assert frames[0] == b"", frames
            if len(frames) == 4:
                topic, seq, payload = frames[1:]
            elif len(frames) == 3:
                topic, (seq, payload) = None, frames[1:]
            else:
                raise AssertionError(f"replay message of {len(frames)} frames: {frames}")
            seq = int.from_bytes(seq, "big", signed=True)
            if seq == END_SEQ:
                return replayed
            replayed.append((topic, seq, payload))
    finally:
        dealer.close(linger=0)


class TestReplayFromPublishers(TinyModelTestCase):
    def setUp(self):
        self.context = zmq.Context()
        self.addCleanup(self.context.term)

    def assert_replays(self, source: dict):
        rank = source["dp_rank"]
        live = receive_live(self.context, source)
        first = min(live)
        # Contiguous live numbers: the replay below must reproduce each of them.
        self.assertEqual(sorted(live), list(range(first, first + LIVE_BATCHES)), sorted(live))
        start = first - REPLAY_LEAD
        replayed = request_replay(self.context, source["replay_endpoint"], start)
        seqs = [seq for _topic, seq, _payload in replayed]
        self.assertTrue(seqs, f"rank {rank}: empty replay from {start}")
        self.assertEqual(seqs[0], start, f"rank {rank}: replay from {start} began at {seqs[0]}")
        self.assertEqual(seqs, list(range(start, start + len(seqs))), f"rank {rank}: {seqs}")
        self.assertLessEqual(max(live), seqs[-1], f"rank {rank}: replay ends before live did")
        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        for topic, seq, payload in replayed:
            if topic is not None:
                self.assertEqual(topic, source["topic"].encode())
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
            infos = [cluster.get_server_info(port) for port in group.grpc_ports]
            sources = []
            for node_rank, info in enumerate(infos):
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
                sources += node_sources
            for source in sources:
                self.assert_replays(source)


if __name__ == "__main__":
    unittest.main()
