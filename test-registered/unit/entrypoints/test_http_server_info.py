"""The leader's HTTP ``/server_info`` goes through the overlay's core builder on every release.

CPU-only, in process, no server socket: the plugin is loaded and its hooks applied through
SGLang's own ``HookRegistry``; then SGLang's real ``/server_info`` route of the real FastAPI
app is awaited with the global state a running frontend would hold (a stand-in tokenizer
manager: it needs a model to exist for real). The plugin installs a leader's HTTP hooks when
the launch starts (``install_launch_hooks``, called directly here: this test launches
nothing). On 0.5.19–0.5.21 that rebinds the route; on 0.5.22+ the route calls SGLang's
``build_server_info``, which the overlay replaces, and is rebound to redact the extras
upstream adds after the builder (the schedulers' ``internal_states``: every resolved server
arg).
"""

import asyncio
import json
import os
import tempfile
import types
import unittest
from pathlib import Path
from unittest import mock

import jsonschema
from overlay_harness import in_process
from overlay_harness.in_process import SOURCES
from sglang.srt.entrypoints import http_server
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay.contract import schema, server_info

register_cpu_ci(est_time=60, suite="base-a-test-cpu")


class TestHttpServerInfo(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="overlay-model-")
        # What a leader's launch installs for HTTP /server_info (0.5.19-0.5.21: no hook, the
        # route is rebound; 0.5.22+: the builder hook, and the route rebound to redact).
        cls.server_args = in_process.leader_with_launch_hooks(Path(cls._tmp.name), [])

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def _server_info(self, internal_states: list | None = None) -> dict:
        async def internal_state():
            return internal_states or [{"stand_in": True}]

        manager = types.SimpleNamespace(
            server_args=self.server_args,
            startup_time={"scheduler_e2e": 0.0},
            get_internal_state=internal_state,
        )
        state = types.SimpleNamespace(
            tokenizer_manager=manager,
            scheduler_info={"status": "ready", "kv_event_sources": SOURCES},
        )
        routes = http_server.app.router.routes
        route = next(r for r in routes if getattr(r, "path", None) == "/server_info")
        with mock.patch.object(http_server, "_global_state", state):
            return asyncio.run(route.endpoint())

    def test_body_is_built_by_the_core(self):
        info = self._server_info()
        self.assertEqual([s["dp_rank"] for s in info["kv_event_sources"]], [0, 1])
        self.assertEqual(info["kv_event_rank_space"]["size"], 2)
        self.assertEqual(info["kv_event_rank_space"]["local_ranks"], [0, 1])
        # Upstream's HTTP-only extras survive.
        self.assertEqual(info["internal_states"], [{"stand_in": True}])
        jsonschema.validate(info, schema.load_schema())

    def test_internal_states_are_redacted(self):
        # What a scheduler answers: its resolved server args, secrets included.
        canaries = ["c4a9f1e2b3d40001", "c4a9f1e2b3d40002", "c4a9f1e2b3d40003"]
        states = [
            {
                "api_key": canaries[0],
                "hicache_storage_backend_extra_config": json.dumps({"secret_key": canaries[1]}),
                "served_model_name": f"s3://user:{canaries[2]}@bucket/m",
                "tp_size": 2,
            }
        ]
        info = self._server_info(states)
        text = json.dumps(info)
        self.assertEqual([c for c in canaries if c in text], [])
        self.assertEqual(info["internal_states"][0]["tp_size"], 2)

    def test_legacy_dp_size_switch_reaches_http(self):
        with mock.patch.dict(os.environ, {server_info.LEGACY_DP_SIZE_ENV: "1"}):
            info = self._server_info()
        self.assertEqual(info["dp_size"], 2)


if __name__ == "__main__":
    unittest.main()
