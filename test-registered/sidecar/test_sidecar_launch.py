"""``--sidecar`` on the leader through SGLang's real launch path, real schedulers, real requests.

CPU-only: SGLang's real scheduler on the CPU test platform, the leader running
``http_server.launch_server`` itself (``overlay_harness.node_process``): uvicorn and the FastAPI
lifespan that binds the native gRPC server and then calls ``start_sidecar`` (the plugin's
supervisor), SGLang's real tokenizer manager and detokenizer. The provider is
``overlay_harness.providers.kv_probe``, which reports each step to a JSON-lines file.

The scenario: the provider starts after the listener is bound (its first ``GetServerInfo``
succeeds) and before uvicorn accepts HTTP (so before SGLang's warm-up request), subscribes to
every advertised source and receives a real request's event batch; then SIGTERM reaches the
node while requests are in flight: the overlay stops the sidecar at once (it records the
SIGTERM, no SIGQUIT follows) before the gRPC server shuts down, and SGLang drains, so every
in-flight request completes whole.

A killed provider bringing the node down (SIGQUIT, as upstream's watchdog does) is
``test_restart_policy.py``'s last step; the released Dynamo consumer on followers, and a
follower's sidecar on SGLang's crash path, are ``contract/test_two_node_group.py``'s.
"""

import contextlib
import json
import signal
import sys
import threading
import time
import unittest
import uuid
from pathlib import Path

from overlay_harness import kv_events, nodes
from overlay_harness.checks import report_launch
from overlay_harness.group import EngineGroup
from overlay_harness.testcase import NodesTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=70, suite="base-a-test-cpu")

PROVIDER = "overlay_harness.providers.kv_probe"
EVENT_DEADLINE = 120.0
# SIGTERM drains the in-flight requests first: 400 decode steps, ~130 s on a 2-core machine
# under a full make test plus other work (seen at 120 s), ~15 s idle.
STOP_DEADLINE = 300.0
RELEASE = releases.installed_sglang_version() or ""
# SGLang's SIGTERM path ends by stopping uvicorn (lifespan shutdown included) from 0.5.20 on;
# 0.5.19 calls sys.exit() from the event loop instead, so its lifespan never shuts down.
SIGTERM_STOPS_UVICORN = RELEASE != "0.5.19"
IN_FLIGHT = 3
IN_FLIGHT_TOKENS = 400


def read_report(path: Path) -> list[dict]:
    with contextlib.suppress(OSError):
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return []


def step(path: Path, name: str) -> dict | None:
    return next((r for r in read_report(path) if r["step"] == name), None)


def request_and_wait(node: nodes.Node) -> None:
    """One more real request, whose stored pages are an event batch (None: keep waiting)."""
    node.generate(kv_events.prompt(), 1, None)


def log_index(text: str, needle: str, start: int = 0) -> int:
    index = text.find(needle, start)
    if index < 0:
        raise AssertionError(f"{needle!r} not in the node log")
    return index


class TestSidecarLaunch(NodesTestCase):
    @contextlib.contextmanager
    def leader(self, report: Path):
        group = EngineGroup(1, ["--tp", "1"])
        launch = group.launch(
            0, sidecar=PROVIDER, sidecar_args=["--report", str(report),
                                               "--sidecar-shutdown-timeout", "20"]
        )  # fmt: skip
        with nodes.running(launch, names=["leader"], log_dir=self.workdir) as (node,):
            yield group, node

    def test_leader_sidecar_starts_after_bind_receives_events_and_stops_first(self):
        report = self.workdir / f"report-{uuid.uuid4().hex}.jsonl"
        began = time.monotonic()
        with self.leader(report) as (group, node):
            node.expect_ready()
            report_launch("one node, --tp 1, a --sidecar", [node], began)
            info = nodes.wait_for(lambda: step(report, "server_info"), EVENT_DEADLINE, "info")
            # Started only after the native listener bound: the first call already answered.
            self.assertEqual(info["attempts"], 1)
            self.assertEqual(info["node_rank"], 0)
            self.assertEqual([s["dp_rank"] for s in info["sources"]], [0])
            self.assertEqual(step(report, "started")["endpoint"],
                             f"http://127.0.0.1:{group.grpc_ports[0]}")  # fmt: skip
            nodes.wait_for(lambda: step(report, "subscribed"), EVENT_DEADLINE, "a subscription")
            received = nodes.wait_for(
                lambda: step(report, "event") or request_and_wait(node),
                EVENT_DEADLINE,
                "the provider to receive a real event batch",
            )
            self.assertEqual(received["endpoint"], f"tcp://127.0.0.1:{group.kv_base}")
            self.assertEqual(received["topic"], "kv")

            results = self.sigterm_with_requests_in_flight(node)
            for result in results:
                self.assertEqual(result.get("completion_tokens"), IN_FLIGHT_TOKENS, results)
            steps = [r["step"] for r in read_report(report)]
            self.assertEqual(steps[-2:], ["sigterm", "exiting"])
            log = node.log_text()
            self.assertNotIn("triggering SIGQUIT", log)
            bound = log_index(log, "Native gRPC server started")
            sidecar_started = log_index(log, f"leader sidecar {PROVIDER} started")
            sigterm = log_index(log, "SIGTERM received")
            sidecar_stopped = log_index(log, f"leader sidecar {PROVIDER} pid=", sidecar_started + 1)
            self.assertLess(bound, sidecar_started)
            # Before uvicorn accepts HTTP, so before SGLang's warm-up request too.
            self.assertLess(sidecar_started, log_index(log, "Uvicorn running on"))
            self.assertLess(sidecar_started, log_index(log, '"POST /generate HTTP'))
            self.assertLess(sigterm, sidecar_stopped)
            if SIGTERM_STOPS_UVICORN:
                self.assertIn("Application shutdown complete", log)
                self.assertLess(sidecar_stopped, log_index(log, "gRPC server shutting down"))
            for line in log.splitlines():
                if "leader sidecar" in line:
                    sys.stderr.write(f"[{RELEASE}] {line}\n")

    def sigterm_with_requests_in_flight(self, node: nodes.Node) -> list[dict]:
        """SIGTERM the node while ``IN_FLIGHT`` long requests run; their ``meta_info``s."""
        results: list[dict] = []

        def request() -> None:
            try:
                results.append(node.generate(kv_events.prompt(8), IN_FLIGHT_TOKENS, None))
            except AssertionError as exc:
                results.append({"error": str(exc)})

        threads = [threading.Thread(target=request) for _ in range(IN_FLIGHT)]
        for thread in threads:
            thread.start()
        nodes.wait_for(
            lambda: f"#running-req: {IN_FLIGHT}" in node.log_text(),
            EVENT_DEADLINE,
            f"{IN_FLIGHT} requests to be decoding",
        )
        signalled = time.monotonic()
        self.assertIn(node.terminate(STOP_DEADLINE), (0, -signal.SIGTERM), node.log_tail())
        for thread in threads:
            thread.join(timeout=STOP_DEADLINE)
        sys.stderr.write(
            f"[{RELEASE}] SIGTERM with {IN_FLIGHT} requests in flight: node exit "
            f"{node.proc.returncode} after {time.monotonic() - signalled:.1f} s; "
            f"{[r.get('completion_tokens', r.get('error')) for r in results]}\n"
        )
        return results


if __name__ == "__main__":
    unittest.main()
