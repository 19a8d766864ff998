"""Ordinary DP aggregate (the seeds' deployment 1): two TP 1 / DP 2 engines, each on its own
node, behind Dynamo's OpenAI frontend, measured as the seed measured it.

CPU-only: SGLang's real schedulers on the CPU test platform, the tiny config-only model, each
engine ``launch_server`` with ``--tp 1 --dp 2`` on its own host (``overlay_harness.netns``): the
real DP controller in front of two schedulers, each with its own ``ZmqEventPublisher``. SGLang
refuses ordinary DP across nodes ("multi-node data parallel is not supported unless dp
attention"), so, as in the seed, each node is a whole engine and Dynamo sees two workers of two
DP ranks each: four (worker, DP rank) targets.

Each engine runs ``--sidecar dynamo.sglang.sidecar`` (ai-dynamo 1.6.1) in leader mode under the
overlay's supervisor, with the ``dp_size`` switch unset. Dynamo's frontend (KV router mode) and
its standalone router (the oracle of what the events told a router) run on the first engine's
host with file discovery, TCP requests and ZMQ events, reaching the second engine across the
test's bridge. The launch is ``overlay_harness.deployments``' row 1, the one ``make validate``
runs in every column.

1. each engine lists both of its DP ranks' sources (distinct ranks and ports; the controller
   drops unknown ready keys before 0.5.22), each delivering a live batch of a real request on
   its own node; later calls get the same reply, built once per launch;
2. the seed's measurements (``overlay_harness.seed_checks``): the router knows exactly the four
   targets; per target, two pinned requests and seven unpinned repeats, each routed
   to the target that holds its prefix and served from its cache (36 requests, 28 unpinned);
   each target's pinned prompt scored on that target and no other. The 40-request benchmark
   of this launch is ``make validate``'s (every column, asserted for the overlay's);
3. the fault table's row c (``overlay_harness.fault_rows``, ``docs/faults.md``): the first
   engine's serving sidecar SIGKILLed under a steady load, with ``--sidecar-restart
   on-failure`` and the frontend's ``--migration-limit``: no request fails or hangs, the
   restarted sidecar's engine is back in the router's view within 10 s with its ranks scored,
   and serves again (row f, the orchestrator's stop, ends deployment 4's test, whose groups
   have followers);
4. a DP scheduler SIGKILLed (the second engine's, after row c): SGLang's watchdog watches the
   engine process's children, and these schedulers are the DP controller's, so stock SGLang
   keeps the engine up with the dead rank's requests waiting for ever (``docs/faults.md``, row
   d); the overlay's watchdog fails the engine stop within 10 s, so a router moves its
   requests (the row under load is ``make faults``').

The two engines take about as much memory as a prefill and a decode engine, so the class holds
the machine's large-topology gate (``overlay_harness.gate``) from its first node's start to its
last one's stop.
"""

import contextlib
import os
import signal
import time
import unittest

import pytest
from overlay_harness import deployments, fault_rows, gate, nodes, seed_checks
from overlay_harness.checks import NodeInfoChecks
from overlay_harness.testcase import DeploymentTestCase
from sglang.test.ci.ci_register import register_cpu_ci

pytestmark = pytest.mark.large_launch

register_cpu_ci(est_time=150, suite="base-a-test-cpu")

ENGINES = 2
DP = 2
MIGRATION_LIMIT = 3


class TestOrdinaryDPAggregate(DeploymentTestCase, NodeInfoChecks):
    @classmethod
    def start(cls, stack: contextlib.ExitStack) -> None:
        stack.enter_context(gate.large_launch(cls.__name__))
        resilience = deployments.Resilience("on-failure", MIGRATION_LIMIT)
        cls.deployment = deployment = deployments.ordinary_dp_aggregate(
            stack, cls.workdir, resilience=resilience
        )
        cls.engines = cls.started = deployment.nodes
        cls.groups = [engine.launch.group for engine in cls.engines]
        cls.infos = [engine.server_info() for engine in cls.engines]
        cls.router, cls.frontend = deployment.router, deployment.frontend

    def test_1_each_engine_lists_both_of_its_dp_ranks(self):
        for group, engine, info in zip(self.groups, self.engines, self.infos, strict=True):
            self.assert_node_info(info, group, 0, list(range(DP)))
            self.assertEqual(info["kv_event_rank_space"]["size"], DP)
            self.assert_group_sources([engine], [info])
            self.assert_reply_built_once(engine, info)

    def test_2_the_seed_measurements_through_dynamos_frontend(self):
        targets = seed_checks.registered_targets(self.router, ENGINES * DP)
        self.assertEqual(len({worker for worker, _rank in targets}), ENGINES, targets)
        self.assertEqual(sorted(rank for _worker, rank in targets), [0, 0, 1, 1])
        self.frontend.wait_for_model()
        measured = seed_checks.measure("1. ordinary DP aggregate, 2 engines on 2 nodes",
                                       self.frontend, self.router, targets)  # fmt: skip
        self.assert_seed_pass(measured)

    def test_3_a_killed_serving_sidecar_restarts_under_load_with_no_failed_request(self):
        self.assert_fault_row(fault_rows.serving_sidecar_killed(self.deployment, "overlay"))

    def test_4_a_killed_dp_scheduler_fails_its_engine_stop(self):
        engine = self.engines[1]
        pid = nodes.wait_for(lambda: fault_rows.scheduler_pid(engine), 30.0, "a scheduler")
        os.kill(pid, signal.SIGKILL)
        gone = fault_rows.gone_within([engine], time.monotonic(), fault_rows.GROUP_GONE)
        self.assertIsNotNone(
            gone,
            f"{engine.name}: processes {fault_rows.node_pids(engine)} left "
            f"{fault_rows.GROUP_GONE} s after its scheduler {pid} was SIGKILLed",
        )
        self.assertIn(f"process {pid} (sglang::schedul", engine.log_text())


if __name__ == "__main__":
    unittest.main()
