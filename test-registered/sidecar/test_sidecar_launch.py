"""``--sidecar`` through SGLang's real launch path, on the leader and (opt-in) on followers.

CPU-only. The only stand-in for a GPU is the model-running part of each scheduler
(``overlay_harness.standin``, which owns a real ``ZmqEventPublisher`` and publishes a real
event batch every 0.5 s). The leader runs ``http_server.launch_server`` itself
(``overlay_harness.providers.http_node``): uvicorn and the FastAPI lifespan that binds the
native gRPC server and then calls ``start_sidecar`` (the plugin's supervisor), with SGLang's
real tokenizer manager and detokenizer (``--skip-tokenizer-init``). Followers run the real
follower branch (``overlay_harness.node``); in a two-node group each node is its own host
(``overlay_harness.netns``), so the follower's consumer and probes run in its namespace.

Scenarios:
1. leader ``--sidecar overlay_harness.providers.kv_probe``: the provider starts after the
   listener is bound (its first ``GetServerInfo`` succeeds), subscribes to every advertised
   source and receives a stand-in's event; killing it brings the node down (SIGQUIT, as
   upstream's watchdog); SIGTERM to the node stops it gracefully first (it records the
   SIGTERM, no SIGQUIT follows), before the gRPC server shuts down.
2. two nodes, the follower with ``--sidecar dynamo.sglang.sidecar --sidecar-on-followers``
   (NVIDIA Dynamo's released consumer, ai-dynamo 1.6.1): it passes validation and waits for
   the leader, for attention DP (with ``SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE=1`` where the
   release reports ``dp_size=1``; with the switch off, ``sglang-sidecar-overlay probe`` says why
   a released consumer rejects the follower: ``contract/test_attention_dp_group.py``). A
   follower without a publisher never gets the consumer:
   ``entrypoints/test_follower_metadata.py``. ``scripts/sglang_envs.py`` installs ai-dynamo in
   every env (``scripts/dynamo_env.py``); a missing install fails the test.
"""

import contextlib
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
import unittest
import uuid
from pathlib import Path
from unittest import mock

from overlay_harness import cluster, differences, dynamo
from overlay_harness.cluster import EngineGroup, HttpLeader
from overlay_harness.dynamo import (
    DYNAMO,
    TRANSPORT_ARGS,
    WAITING_FOR_LEADER,
)
from overlay_harness.testcase import TinyModelTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=85, suite="base-a-test-cpu")

PROVIDER = "overlay_harness.providers.kv_probe"
EVENT_DEADLINE = 120.0
CONSUMER_DEADLINE = 180.0
STOP_DEADLINE = 90.0
RELEASE = releases.installed_sglang_version() or ""
ATTENTION_DP_REPORTS_DP_SIZE_1 = releases.adapter_for(RELEASE or "0") == (
    "sglang_sidecar_overlay.adapters.v0_5_22"
)


# SGLang's SIGTERM path ends by stopping uvicorn (lifespan shutdown included) from 0.5.20 on;
# 0.5.19 calls sys.exit() from the event loop instead, so its lifespan never shuts down.
SIGTERM_STOPS_UVICORN = RELEASE != "0.5.19"


def _dynamo_installed() -> bool:
    with contextlib.suppress(ImportError, ValueError):
        return importlib.util.find_spec(DYNAMO) is not None
    return False


def read_report(path: Path) -> list[dict]:
    with contextlib.suppress(OSError):
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return []


def wait_for_step(path: Path, step: str, timeout: float) -> dict:
    return cluster.wait_for(
        lambda: next((r for r in read_report(path) if r["step"] == step), None),
        timeout,
        f"the provider to report {step!r}",
    )


def log_index(text: str, needle: str) -> int:
    index = text.find(needle)
    if index < 0:
        raise AssertionError(f"{needle!r} not in the node log")
    return index


class TestSidecarLaunch(TinyModelTestCase):
    @contextlib.contextmanager
    def leader(self, group: EngineGroup, report: Path):
        args = group.for_node(
            0, PROVIDER, ["--report", str(report), "--sidecar-shutdown-timeout", "20"]
        )
        with (
            tempfile.TemporaryDirectory(prefix="overlay-leader-") as log_dir,
            cluster.running(HttpLeader(args, Path(log_dir), "leader")) as node,
        ):
            yield node

    # --- scenario 1 ------------------------------------------------------------------------

    def test_leader_sidecar_starts_after_bind_receives_events_and_stops_first(self):
        group = EngineGroup(self.model, 1, ["--tp", "1"])
        report = self.workdir / f"report-{uuid.uuid4().hex}.jsonl"
        with self.leader(group, report) as node:
            node.expect_ready()
            info = wait_for_step(report, "server_info", EVENT_DEADLINE)
            # Started only after the native listener bound: the first call already answered.
            self.assertEqual(info["attempts"], 1)
            self.assertEqual(info["node_rank"], 0)
            self.assertEqual([s["dp_rank"] for s in info["sources"]], [0])
            started = wait_for_step(report, "started", 1)
            self.assertEqual(started["endpoint"], f"http://127.0.0.1:{group.grpc_ports[0]}")
            received = wait_for_step(report, "event", EVENT_DEADLINE)
            self.assertEqual(received["endpoint"], f"tcp://127.0.0.1:{group.kv_base}")
            self.assertEqual(received["topic"], "kv")
            wait_for_step(report, "idle", EVENT_DEADLINE)

            # SIGTERM reaches the real tokenizer manager's handler: the overlay stops the
            # sidecar at once; SGLang drains, kills the node's children, then (0.5.20+) stops
            # uvicorn, whose lifespan shuts gRPC down.
            self.assertIn(node.terminate(STOP_DEADLINE), (0, -signal.SIGTERM), node.log_tail())
            steps = [r["step"] for r in read_report(report)]
            self.assertEqual(steps[-2:], ["sigterm", "exiting"])
            log = node.log_path.read_text(errors="replace")
            self.assertNotIn("triggering SIGQUIT", log)
            bound = log_index(log, "Native gRPC server started")
            sidecar_started = log_index(log, f"leader sidecar {PROVIDER} started")
            sigterm = log_index(log, "SIGTERM received")
            sidecar_stopped = log_index(log, f"leader sidecar {PROVIDER} pid=")
            self.assertLess(bound, sidecar_started)
            self.assertLess(sigterm, sidecar_stopped)
            if SIGTERM_STOPS_UVICORN:
                self.assertIn("Application shutdown complete", log)
                self.assertLess(sidecar_stopped, log_index(log, "gRPC server shutting down"))
            for line in log.splitlines():
                if "leader sidecar" in line:
                    sys.stderr.write(f"[{RELEASE}] {line}\n")

    def test_killing_the_leader_sidecar_brings_the_node_down(self):
        group = EngineGroup(self.model, 1, ["--tp", "1"])
        report = self.workdir / f"report-{uuid.uuid4().hex}.jsonl"
        with self.leader(group, report) as node:
            node.expect_ready()
            provider = wait_for_step(report, "idle", EVENT_DEADLINE)
            killed_at = time.monotonic()
            os.kill(provider["pid"], signal.SIGKILL)
            node.proc.wait(timeout=STOP_DEADLINE)
            sys.stderr.write(
                f"[{RELEASE}] node down {time.monotonic() - killed_at:.2f} s after the provider "
                "was killed\n"
            )
            self.assertNotEqual(node.proc.returncode, 0)
            log = node.log_path.read_text(errors="replace")
            self.assertIn("triggering SIGQUIT", log)
            for line in log.splitlines():
                if "SIGQUIT" in line or "kill_process_tree" in line:
                    sys.stderr.write(f"[{RELEASE}] {line}\n")
            node.wait_gone()

    # --- scenario 2 ------------------------------------------------------------------------

    def run_follower_consumer(self, parallel: list[str], *, legacy: bool) -> tuple[str, dict]:
        group = EngineGroup(self.model, 2, parallel)
        report = self.workdir / f"report-{uuid.uuid4().hex}.jsonl"
        follower_args = [
            "--sidecar-on-followers",
            "--sidecar-shutdown-timeout", "10",
            "--grpc-endpoint", f"http://{group.address(1)}:{group.grpc_ports[1]}",
            *TRANSPORT_ARGS,
            "--namespace", f"overlay-{uuid.uuid4().hex[:12]}",
        ]  # fmt: skip
        env = dynamo.consumer_environ(self.workdir, legacy=legacy)
        with (
            mock.patch.dict(os.environ, env, clear=True),
            tempfile.TemporaryDirectory(prefix="overlay-nodes-") as log_dir,
        ):
            leader, follower = cluster.start_nodes(
                lambda args, index: (HttpLeader, cluster.Node)[index](
                    args, Path(log_dir), ("leader", "follower")[index]
                ),
                [
                    group.for_node(0, PROVIDER, ["--report", str(report)]),
                    group.for_node(1, DYNAMO, follower_args),
                ],
            )
            try:
                for node in (leader, follower):
                    node.expect_ready()
                info = follower.server_info()

                def waiting_line() -> str | None:
                    text = follower.log_path.read_text(errors="replace")
                    return next((ln for ln in text.splitlines() if WAITING_FOR_LEADER in ln), None)

                line = cluster.wait_for(
                    waiting_line, CONSUMER_DEADLINE, "the released consumer to wait for the leader"
                )
                self.assertIn(f"dist_init:tcp://{group.dist_init_addr}", line)
                self.assertIn("node_rank=1", line)
                wait_for_step(report, "event", EVENT_DEADLINE)
                sys.stderr.write(f"[{RELEASE}] {' '.join(parallel)} legacy={legacy}: {line}\n")
                follower.stop(timeout=STOP_DEADLINE)
                log = follower.log_path.read_text(errors="replace")
                sidecar_started = log_index(log, f"follower sidecar {DYNAMO} started")
                sidecar_stopped = log_index(log, f"follower sidecar {DYNAMO} pid=")
                self.assertLess(sidecar_started, sidecar_stopped)
                if differences.differs(differences.FOLLOWER_SERVER_LOG_LINES):
                    # Upstream's Rust follower server logs nothing here; GetServerInfo answered
                    # above, before the consumer's first wait line.
                    self.assertNotIn("follower metadata server at", log)
                else:
                    # The metadata server serves before the sidecar starts and stops after it,
                    # through SGLang's Engine.shutdown (0.5.19-0.5.21: the overlay's BEFORE
                    # hook; 0.5.22+: stop_grpc_server), i.e. before the schedulers are killed:
                    # no scheduler exit is seen first.
                    server = f"follower metadata server at {follower.address}:{follower.grpc_port}"
                    server_serving = log_index(log, f"{server} is SERVING")
                    server_stopped = log_index(log, f"{server} stopped")
                    self.assertLess(server_serving, sidecar_started)
                    self.assertLess(sidecar_stopped, server_stopped)
                    self.assertNotIn(f"{server} is NOT_SERVING", log[:server_stopped])
                for ln in log.splitlines():
                    if "follower sidecar" in ln:
                        sys.stderr.write(f"[{RELEASE}] {ln}\n")
                return line, info
            except BaseException:
                for node in (leader, follower):
                    sys.stderr.write(f"--- {node.name} log (tail) ---\n{node.log_tail(80)}\n")
                raise
            finally:
                follower.stop(timeout=STOP_DEADLINE)
                leader.stop(timeout=5)

    def test_follower_attention_dp_released_consumer_waits_for_leader(self):
        self.assertTrue(_dynamo_installed(), "the harness installs ai-dynamo 1.6.1 in every env")
        legacy = ATTENTION_DP_REPORTS_DP_SIZE_1
        parallel = ["--tp", "2", "--dp", "2", "--enable-dp-attention"]
        _, info = self.run_follower_consumer(parallel, legacy=legacy)
        self.assertEqual(info["dp_size"], 2)
        self.assertEqual(info["kv_event_rank_space"]["size"], 2)


if __name__ == "__main__":
    unittest.main()
