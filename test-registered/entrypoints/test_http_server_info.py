"""The leader's HTTP ``/server_info`` over the wire, from SGLang's real uvicorn server.

CPU-only, one leader for the whole class, launched through SGLang's real
``http_server.launch_server`` (``cluster.HttpLeader``: uvicorn, the FastAPI lifespan, the real
tokenizer manager and detokenizer, the native gRPC server); the only stand-in is the
model-running part of each scheduler (``overlay_harness.standin``, with a real KV-event
publisher made by SGLang's factory). Attention DP on one node (``--tp 2 --dp 2
--enable-dp-attention``): two publisher ranks behind SGLang's DP controller, which sends the
route's ``GetInternalStateReq`` to both DP groups' schedulers itself
(``--enable-dp-attention-local-control-broadcast``; the stand-ins answer it with their resolved
server args, as a real scheduler does).

The test sends real ``GET /server_info`` and ``GET /get_server_info`` (the deprecated alias)
requests. The plugin installs the route's transform when the launch starts (0.5.19–0.5.21:
the route is rebound to the core builder; 0.5.22+: SGLang's ``build_server_info`` is replaced
and the route rebound to redact the extras upstream adds after it). The node runs with
``SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE=1``, so HTTP must report attention DP as ``dp_size=2``
on every release (0.5.22+ report 1 without it). Secret scanning of every field and of both
nodes' logs is ``security/test_planted_secrets.py``'s; here one planted secret checks that the
alias is redacted too and that the non-secret parts of ``internal_states`` survive redaction.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.request
from pathlib import Path
from unittest import mock

import jsonschema
from overlay_harness import cluster
from overlay_harness.cluster import EngineGroup, HttpLeader
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay.contract import schema, server_info
from sglang_sidecar_overlay.contract.redaction import REDACTED

register_cpu_ci(est_time=34, suite="base-a-test-cpu")

# The route waits for both DP groups' internal state through the DP controller.
HTTP_DEADLINE = 120.0
STOP_DEADLINE = 60.0
ROUTES = ("/server_info", "/get_server_info")
CANARY = "c4a9f1e2b3d4e5f60013"
EXTRA_CONFIG = {"secret_key": CANARY, "prefix": "overlay-http"}


def http_listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=5):
        return True
    return False


def http_get_json(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=HTTP_DEADLINE) as reply:
        return json.loads(reply.read())


class TestHttpServerInfo(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="overlay-http-")
        workdir = Path(cls._tmp.name)
        model = cluster.write_tiny_model(workdir / "tiny-llama")
        cls.group = EngineGroup(
            model,
            1,
            ["--tp", "2", "--dp", "2", "--enable-dp-attention",
             "--enable-dp-attention-local-control-broadcast"],
        )  # fmt: skip
        extra_config = json.dumps(EXTRA_CONFIG)
        args = [*cls.group.for_node(0), "--hicache-storage-backend-extra-config", extra_config]
        with mock.patch.dict(os.environ, {server_info.LEGACY_DP_SIZE_ENV: "1"}):
            cls.leader = HttpLeader(args, workdir, "leader")
        try:
            cls.leader.expect_ready()
            port = cls.group.http_ports[0]
            # With --skip-server-warmup, launch_callback can run before uvicorn has bound its
            # socket (seen on 0.5.23: its own post-warmup request is refused too).
            cluster.wait_for(lambda: http_listening(port), HTTP_DEADLINE, "uvicorn to listen")
            cls.bodies = {path: http_get_json(port, path) for path in ROUTES}
            cls.grpc_info = cls.leader.server_info()
        except BaseException:
            sys.stderr.write(f"--- leader log (tail) ---\n{cls.leader.log_tail(120)}\n")
            cls.leader.stop(timeout=10)
            cls._tmp.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        # The orderly stop of a launch_server node is a signal (its stdin is not read).
        with contextlib.suppress(subprocess.TimeoutExpired):
            cls.leader.terminate(STOP_DEADLINE)
        cls.leader.stop(timeout=0)
        cls._tmp.cleanup()

    def test_body_is_built_by_the_core_and_matches_the_schema(self):
        for path, info in self.bodies.items():
            with self.subTest(path=path):
                jsonschema.validate(info, schema.load_schema())
                sources = info["kv_event_sources"]
                self.assertEqual([s["dp_rank"] for s in sources], [0, 1])
                self.assertEqual(
                    [s["endpoint"] for s in sources],
                    [f"tcp://127.0.0.1:{self.group.kv_base + r}" for r in (0, 1)],
                )
                self.assertEqual(info["kv_event_rank_space"]["size"], 2)
                self.assertEqual(info["kv_event_rank_space"]["local_ranks"], [0, 1])
                # The same launch's core object as native gRPC GetServerInfo serves.
                self.assertEqual(info["incarnation"], self.grpc_info["incarnation"])
                self.assertEqual(info["contract_version"], self.grpc_info["contract_version"])
                self.assertEqual(sources, self.grpc_info["kv_event_sources"])

    def test_internal_states_come_from_both_dp_groups_redacted(self):
        for path, info in self.bodies.items():
            with self.subTest(path=path):
                states = info["internal_states"]
                self.assertEqual([s.get("tp_size") for s in states], [2, 2], states)
                self.assertNotIn(CANARY, json.dumps(info))
                for state in states:
                    # The secret inside the JSON string is hidden; the rest of it survives.
                    extra = json.loads(state["hicache_storage_backend_extra_config"])
                    self.assertEqual(extra, {**EXTRA_CONFIG, "secret_key": REDACTED})

    def test_legacy_dp_size_switch_reaches_http(self):
        for path, info in self.bodies.items():
            with self.subTest(path=path):
                self.assertEqual(info["dp_size"], 2)
        self.assertEqual(self.grpc_info["dp_size"], 2)


if __name__ == "__main__":
    unittest.main()
