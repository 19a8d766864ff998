"""Attention DP disaggregated (the seeds' deployment 4), the seed's shape: a TP 2 / attention-DP 2
prefill engine across two nodes and a decode engine of the same shape across two more, moving
real KV pages, behind Dynamo's OpenAI frontend.

CPU-only: four hosts (``overlay_harness.netns``), SGLang's real schedulers on the CPU test
platform, Mooncake's CPU build writing every request's KV pages over TCP from the prefill rank
that computed them to the decode rank that generates (the platform's part and the launch
flags in ``overlay_harness.pd``). Every node runs Dynamo 1.6.1's sidecar under the
overlay's supervisor, in its engine's disaggregation mode: serving on the leaders, relaying on
the followers (``--sidecar-on-followers``). In the seed's run a stock follower's sidecar rejected
rank 1 ("outside dp_size 1") before anything was served; here each follower advertises its own
rank's events and the leader's sidecar registers both ranks.

Dynamo's frontend (KV router mode) and the two oracle routers (``dynamo.PrefillDecodeRouters``,
started before the engines) run on the decode leader's host: ``overlay_harness.deployments``'
row 4, the launch ``make validate`` runs in every column. The seed's measurements
(``overlay_harness.seed_checks``): the routers know both prefill and both decode ranks; each
(prefill rank, decode rank) pair pinned in turn,
the unpinned repeats finding the prefill rank that holds their prompt (36 requests, 28
unpinned); every rank's events seen by its router. Transfers: every digest a prefill node
sent is verified by a decode node, and no request fails a checksum. The 40-request benchmark
of this launch is ``make validate``'s (every column, asserted for the overlay's).

The four nodes are the largest topology of the tier (8.5 GiB PSS), so the class holds the
machine's large-topology gate (``overlay_harness.gate``), and it runs in the newest release's
session with the plugin only (``seed_checks.benchmark_asserted_here``): the column ``make test``
asserts. The prefill's transferred bytes are not checked here: a follower node serves no
``/metrics``, so half the transfers would be unseen (deployment 3 checks them).

Last, the fault table's row f (``overlay_harness.fault_rows``, ``docs/faults.md``) takes the
deployment down as an orchestrator stops it: SIGTERM to all four nodes with requests in flight
through the frontend, SIGKILL after a 30 s grace period. Every process is gone within it, each
node's sidecar (serving on the leaders, relaying on the followers) is told and stops before its
node's server, each node exits as ``docs/faults.md`` says, and no request hangs.
"""

import collections
import contextlib
import unittest

import pytest
from overlay_harness import deployments, dynamo, fault_rows, gate, pd, seed_checks
from overlay_harness.testcase import DeploymentTestCase
from sglang.test.ci.ci_register import register_cpu_ci

pytestmark = pytest.mark.large_launch

register_cpu_ci(est_time=240, suite="base-a-test-cpu")

MISSING = pd.missing_piece()


@unittest.skipIf(MISSING is not None, f"no real PD transfer here: {MISSING}")
@unittest.skipUnless(
    seed_checks.benchmark_asserted_here(),
    "the newest release's session with the plugin only: the column make test asserts",
)
class TestAttentionDPDisaggregation(DeploymentTestCase):
    @classmethod
    def start(cls, stack: contextlib.ExitStack) -> None:
        stack.enter_context(gate.large_launch(cls.__name__))
        cls.deployment = deployment = deployments.attention_dp_disaggregate(stack, cls.workdir)
        cls.started = deployment.nodes
        cls.prefill_nodes, cls.decode_nodes = deployment.prefill, deployment.decode
        cls._measure_through_dynamo(deployment.frontend, deployment.router)

    @classmethod
    def _measure_through_dynamo(cls, frontend: dynamo.Frontend, routers) -> None:
        sent_before = pd.digest_counts(cls.prefill_nodes)
        received_before = pd.digest_counts(cls.decode_nodes)
        cls.measured, *cls.dynamo_targets = seed_checks.measure_disaggregated(
            "4. attention DP disaggregate, TP 2 / attention DP 2 prefill and decode on 4 nodes",
            frontend, routers, 2,
        )  # fmt: skip
        cls.sent = [d for d, _pages in pd.digests_since(cls.prefill_nodes, sent_before)]
        cls.received = [d for d, _pages in pd.digests_since(cls.decode_nodes, received_before)]
        cls.decode_logs = "".join(node.log_text() for node in cls.decode_nodes)

    def test_1_the_seed_measurements_through_dynamos_frontend(self):
        prefill_targets, decode_targets = self.dynamo_targets
        self.assertEqual(sorted(rank for _worker, rank in prefill_targets), [0, 1])
        self.assertEqual(sorted(rank for _worker, rank in decode_targets), [0, 1])
        self.assert_seed_pass(self.measured)

    def test_2_checksums_agree_for_every_request(self):
        bench, targeted = self.measured.benchmark, self.measured.targeted
        requests = targeted.requests + (2 * bench.requests if bench else 0)
        # Every request a digest, the probes (one or more, until one was served) too.
        self.assertGreaterEqual(len(self.sent), requests + 1, self.sent)
        self.assertEqual(collections.Counter(self.received), collections.Counter(self.sent))
        self.assertNotIn("KV checksum mismatch", self.decode_logs)
        print(f"{requests} requests through Dynamo, each digest verified by a decode node")

    def test_3_the_orchestrators_stop_under_load_ends_every_process_and_request(self):
        self.assert_fault_row(fault_rows.group_stopped(self.deployment, "overlay"))


if __name__ == "__main__":
    unittest.main()
