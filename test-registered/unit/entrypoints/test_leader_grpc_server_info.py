"""The leader's native gRPC ``GetServerInfo`` reply is built once per launch, then cached text.

CPU-only, in process, no server socket: SGLang's real ``RuntimeHandle.get_server_info`` (what
its Rust gRPC server calls for ``GetServerInfo``) on handles holding a leader's launch-time
state, with the hooks a native-gRPC leader's launch installs through SGLang's own
``HookRegistry`` (``install_launch_hooks``, called directly here: this test launches nothing).
Each handle is made without ``__init__``, which would start the tokenizer manager's event loop;
a stand-in tokenizer manager carries the real server args (it needs a model to exist for real).
"""

import json
import types
import unittest

import jsonschema
from overlay_harness import in_process
from overlay_harness.in_process import SOURCES
from sglang.srt.entrypoints.grpc_bridge import RuntimeHandle
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay.contract import schema

register_cpu_ci(est_time=9, suite="base-a-test-cpu")


class TestLeaderGrpcServerInfo(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        # A native-gRPC leader's launch-time groups.
        cls.server_args = in_process.leader_with_launch_hooks(["leader_grpc"])

    def _handle(self, sources: list) -> RuntimeHandle:
        handle = RuntimeHandle.__new__(RuntimeHandle)
        handle.tokenizer_manager = types.SimpleNamespace(
            server_args=self.server_args, mm_processor=None
        )
        handle.server_args = self.server_args
        handle.scheduler_info = {"status": "ready", "kv_event_sources": list(sources)}
        return handle

    def test_reply_is_the_core_contract(self):
        info = json.loads(self._handle(SOURCES).get_server_info())
        self.assertEqual([s["dp_rank"] for s in info["kv_event_sources"]], [0, 1])
        self.assertEqual(info["kv_event_rank_space"]["local_ranks"], [0, 1])
        jsonschema.validate(info, schema.load_schema())

    def test_reply_is_built_once_per_launch(self):
        handle = self._handle(SOURCES)
        first = handle.get_server_info()
        # The launch's state changing under the handle does not reach the served text...
        handle.scheduler_info["kv_event_sources"] = []
        self.assertEqual(handle.get_server_info(), first)
        # ...while another launch's handle builds its own.
        other = json.loads(self._handle([]).get_server_info())
        self.assertEqual(other["kv_event_sources"], [])


if __name__ == "__main__":
    unittest.main()
