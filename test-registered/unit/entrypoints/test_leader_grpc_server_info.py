"""The leader's native gRPC ``GetServerInfo`` reply is the core builder's, built once per launch,
then cached text.

CPU-only, in process, no server socket: SGLang's real ``RuntimeHandle.get_server_info`` (what
its Rust gRPC server calls for ``GetServerInfo``) on handles holding a leader's launch-time
state, with the hooks a native-gRPC leader's launch installs through SGLang's own
``HookRegistry`` (``install_launch_hooks``, called directly here: this test launches nothing).
Each handle is made without ``__init__``, which would start the tokenizer manager's event loop;
a stand-in tokenizer manager carries the real server args (it needs a model to exist for real)
and, from 0.5.23, a stand-in multimodal processor whose image token upstream reports in
``grpc_features``.
"""

import json
import os
import types
import unittest
from unittest import mock

import jsonschema
from overlay_harness import in_process
from overlay_harness.in_process import SOURCES
from sglang.srt.entrypoints.grpc_bridge import RuntimeHandle
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay import releases
from sglang_sidecar_overlay.adapters import _node_launch
from sglang_sidecar_overlay.contract import schema, server_info
from sglang_sidecar_overlay.contract.redaction import REDACTED

register_cpu_ci(est_time=9, suite="base-a-test-cpu")

RELEASE = tuple(
    int(part)
    for part in releases.release_of(releases.installed_sglang_version() or "0.0.0").split(".")
)
# What upstream's reply adds after its builder (0.5.23+), and the fields SGLang's own
# watermark redaction hides whatever they hold (0.5.22+), both kept in the core's reply.
MEDIA_FEATURES = RELEASE >= (0, 5, 23)
WATERMARK_FIELDS = ("watermark_key", "watermark_key_b", "watermark_config")
WATERMARKING = RELEASE >= (0, 5, 22)
BOUNDS = ("replay_buffer_steps", "hwm", "max_queue_size")


class TestLeaderGrpcServerInfo(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        # A native-gRPC leader's launch-time groups.
        cls.server_args = in_process.leader_with_launch_hooks(["leader_grpc"])

    def _handle(self, sources: list) -> RuntimeHandle:
        handle = RuntimeHandle.__new__(RuntimeHandle)
        tokens = types.SimpleNamespace(image_token="<image>", video_token=None, audio_token=None)
        handle.tokenizer_manager = types.SimpleNamespace(
            server_args=self.server_args, mm_processor=types.SimpleNamespace(mm_tokens=tokens)
        )
        handle.server_args = self.server_args
        handle.scheduler_info = {"status": "ready", "kv_event_sources": list(sources)}
        return handle

    def test_reply_is_the_core_contract(self):
        info = json.loads(self._handle(SOURCES).get_server_info())
        self.assertEqual([s["dp_rank"] for s in info["kv_event_sources"]], [0, 1])
        self.assertEqual(info["kv_event_rank_space"]["local_ranks"], [0, 1])
        jsonschema.validate(info, schema.load_schema())

    def test_sources_carry_the_node_publisher_bounds(self):
        info = json.loads(self._handle(SOURCES).get_server_info())
        for source in info["kv_event_sources"]:
            # The harness' --kv-events-config sets none: SGLang's KVEventsConfig defaults.
            self.assertTrue(all(isinstance(source[bound], int) for bound in BOUNDS), source)

    def test_with_no_launch_the_hook_raises_naming_the_cause(self):
        # An engine built outside SGLang's launch path: no launch hook ran, none began, and
        # the hook does not begin one.
        cause = "the leader's GetServerInfo needs this node's launch, but no launch began"
        with mock.patch.object(_node_launch.PROCESS, "launch", None):
            with self.assertRaisesRegex(_node_launch.NoLaunchError, cause):
                self._handle(SOURCES).get_server_info()
            with self.assertRaises(_node_launch.NoLaunchError):
                _node_launch.current_launch("this test")

    def test_legacy_dp_size_switch_reaches_grpc(self):
        # The switch is read once, when a launch begins; the next tests get one without it.
        with mock.patch.dict(os.environ, {server_info.LEGACY_DP_SIZE_ENV: "1"}):
            in_process.begin_launch(self.server_args)
        self.addCleanup(in_process.begin_launch, self.server_args)
        info = json.loads(self._handle(SOURCES).get_server_info())
        # --dp 2 --enable-dp-attention: two publisher ranks (0.5.22+ report dp_size=1 without).
        self.assertEqual(info["dp_size"], 2)

    def test_upstream_extras_and_watermark_redaction_are_kept(self):
        info = json.loads(self._handle(SOURCES).get_server_info())
        if MEDIA_FEATURES:
            self.assertEqual(info["grpc_features"], ["image_inputs"])
        else:
            self.assertNotIn("grpc_features", info)
        for field in WATERMARK_FIELDS if WATERMARKING else ():
            # Unset here: SGLang hides the field whatever it holds, and the reply agrees.
            self.assertEqual(info[field], REDACTED, field)

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
