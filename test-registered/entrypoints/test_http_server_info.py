"""The leader's HTTP ``/server_info`` over the wire, from SGLang's real uvicorn server.

CPU-only, one leader for the whole class, launched through SGLang's real
``http_server.launch_server`` (uvicorn, the FastAPI lifespan, the real tokenizer manager and
detokenizer, the native gRPC server) with SGLang's real schedulers on the CPU test platform.
Attention DP on one node (``--tp 2 --dp 2 --enable-dp-attention``): two publisher ranks behind
SGLang's real DP controller, whose schedulers answer the route's ``GetInternalStateReq`` with
SGLang's own ``get_internal_state`` (each DP group's resolved server args and live counters).

The test sends real ``GET /server_info`` and ``GET /get_server_info`` (the deprecated alias)
requests. The plugin installs the route's transform when the launch starts: on every release
the route is rebound to pass upstream's body through the core builder (0.5.22+: with the
node's publisher bounds, which upstream's sources lack; SGLang's own ``build_server_info`` is
not hooked). The node runs with ``SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE=1`` (and the series'
name for it), so HTTP must report attention DP as ``dp_size=2`` on every release (0.5.22+
report 1 without it). Secret scanning of every field and of both nodes' logs is
``security/test_planted_secrets.py``'s; here one planted secret checks that the alias is
redacted too and that the non-secret parts of ``internal_states`` survive redaction.
On 0.5.19-0.5.21 the schedulers' sources reach the engine past the DP controller through the
overlay's side channel, a private directory removed once the node is ready.
"""

import contextlib
import json
import os
import sys
import unittest
from pathlib import Path

import jsonschema
from overlay_harness import differences, nodes, probes
from overlay_harness.group import EngineGroup
from overlay_harness.testcase import NodesTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases
from sglang_sidecar_overlay.adapters._hooks import CHILD_LAUNCH_ENV
from sglang_sidecar_overlay.contract import schema
from sglang_sidecar_overlay.contract.redaction import REDACTED

register_cpu_ci(est_time=45, suite="base-a-test-cpu")

ROUTES = ("/server_info", "/get_server_info")
# 0.5.19-0.5.21: the DP controller drops the schedulers' sources, which reach the engine
# through the overlay's side channel (a private directory) instead.
SIDE_CHANNEL = releases.adapter_for(releases.installed_sglang_version() or "0") == (
    "sglang_sidecar_overlay.adapters.v0_5_19"
)
CANARY = "c4a9f1e2b3d4e5f60013"
EXTRA_CONFIG = {"secret_key": CANARY, "prefix": "overlay-http"}
BOUNDS = ("replay_buffer_steps", "hwm", "max_queue_size")


class TestHttpServerInfo(NodesTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.group = EngineGroup(1, ["--tp", "2", "--dp", "2", "--enable-dp-attention"])
        launch = cls.group.launch(
            0,
            extra=["--hicache-storage-backend-extra-config", json.dumps(EXTRA_CONFIG)],
            env=differences.dp_size_switch(True),
        )
        cls.leader = nodes.Node(launch, Path(cls.workdir), "leader")
        try:
            cls.leader.expect_ready()
            cls.bodies = {}
            for path in ROUTES:
                status, text = cls.leader.inside(
                    probes.http_text, cls.leader.http_port, cls.leader.address, path
                )
                if status != 200:
                    raise AssertionError(f"{path}: {status} {text[:2000]}")
                cls.bodies[path] = json.loads(text)
            cls.grpc_info = cls.leader.server_info()
        except BaseException:
            sys.stderr.write(f"--- leader log (tail) ---\n{cls.leader.log_tail(120)}\n")
            cls.leader.stop(timeout=10)
            super().tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            cls.leader.stop()
        finally:
            super().tearDownClass()

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
                for source in sources:
                    self.assertTrue(all(isinstance(source.get(b), int) for b in BOUNDS), source)
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

    def test_side_channel_directory_is_gone_once_ready(self):
        exported = set()
        for pid in nodes.pids_with_tag(self.leader.tag):
            with contextlib.suppress(OSError):
                for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    name, _, value = entry.decode(errors="replace").partition("=")
                    if name == CHILD_LAUNCH_ENV and value:
                        sources_dir = json.loads(value).get("sources_dir")
                        exported |= {sources_dir} if sources_dir else set()
        if not SIDE_CHANNEL:
            self.assertEqual(exported, set())
            return
        # The schedulers were spawned with it (so it was used), and it is removed.
        self.assertEqual(len(exported), 1, exported)
        self.assertFalse(os.path.exists(exported.pop()))

    def test_legacy_dp_size_switch_reaches_http(self):
        for path, info in self.bodies.items():
            with self.subTest(path=path):
                self.assertEqual(info["dp_size"], 2)
        self.assertEqual(self.grpc_info["dp_size"], 2)


if __name__ == "__main__":
    unittest.main()
