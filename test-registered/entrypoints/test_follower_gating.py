"""When a follower node gets the overlay's metadata server, and when its launch fails instead.

CPU-only. Every node runs SGLang's real launch code in its own process (``overlay_harness.node``:
``Engine._launch_subprocesses``, the real follower branch) with this plugin loaded by SGLang's
plugin framework; the only stand-in is the model-running part of each scheduler
(``overlay_harness.standin``, a real ``ZmqEventPublisher`` from SGLang's factory). Each scenario
goes red when the overlay's gate or check it covers is gone:

- no native gRPC on the follower (no ``--grpc-port``, or legacy/SMG mode with ``--grpc-mode``):
  no overlay metadata server, the launch still succeeds (``_sglang.native_grpc_enabled``,
  which picks the follower's hook groups);
- ``SGLANG_RUST_SERVER=1``: 0.5.22+ leave the follower to upstream, which starts no Python
  metadata server in that mode; 0.5.19–0.5.21 have no follower server of their own and the
  Rust server no gRPC listener, so the overlay's still serves (``docs/compatibility.md``);
- two ranks of a follower claiming one endpoint address: the follower's launch fails with
  ``SourceConflictError`` naming the address, and no scheduler is left behind. SGLang's rank
  offset never produces this; the stand-in's ``SHARED_KV_ENDPOINT_ENV`` knob drops the offset
  on followers, so with an ``ipc://`` endpoint both ranks really bind and report one path.
"""

import os
import unittest
from unittest import mock

from overlay_harness import cluster, probes, standin
from overlay_harness.cluster import EngineGroup
from overlay_harness.testcase import TinyModelTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=105, suite="base-a-test-cpu")

# 0.5.22+ ship their own follower metadata server; the overlay replaces it except in
# SGLANG_RUST_SERVER mode.
UPSTREAM_FOLLOWER_SERVER = releases.adapter_for(releases.installed_sglang_version() or "0") == (
    "sglang_sidecar_overlay.adapters.v0_5_22"
)
FOLLOWER_SERVER_LOG = "follower metadata server"
STOP_DEADLINE = 120.0


def without_option(args: list[str], option: str) -> list[str]:
    """``args`` without ``option`` and its value."""
    index = args.index(option)
    return args[:index] + args[index + 2 :]


def with_option(args: list[str], option: str, value: str) -> list[str]:
    """``args`` with ``option``'s value replaced."""
    index = args.index(option)
    return [*args[: index + 1], value, *args[index + 2 :]]


class TestFollowerGating(TinyModelTestCase):
    def assert_serves_nothing(self, follower: cluster.Node, port: int):
        follower.expect_ready()
        served = follower.inside(probes.health, port, follower.address)
        self.assertIsNone(served, f"something serves on {port}")
        self.assertNotIn(FOLLOWER_SERVER_LOG, follower.log_tail(400))

    def test_conflicting_sources_fail_the_follower_launch(self):
        group = EngineGroup(self.model, 2, ["--tp", "4", "--dp", "4", "--enable-dp-attention"])
        shared = f"ipc://{self.workdir}/follower-kv"
        kv_events = f'{{"publisher": "zmq", "endpoint": "{shared}", "topic": "kv"}}'
        follower_args = with_option(group.for_node(1), "--kv-events-config", kv_events)
        with (
            mock.patch.dict(os.environ, {standin.SHARED_KV_ENDPOINT_ENV: "1"}),
            cluster.nodes(group.for_node(0), follower_args) as (_leader, follower),
        ):
            event = follower.ready()
            self.assertEqual(event["event"], "error", follower.log_tail())
            self.assertIn("SourceConflictError", event["error"])
            self.assertIn(f"address {shared} is claimed by two KV sources", event["error"])
            follower.proc.wait(timeout=STOP_DEADLINE)
            self.assertNotEqual(follower.proc.returncode, 0)
            self.assertIsNone(follower.health())
            follower.wait_gone()

    def test_no_metadata_server_without_native_grpc(self):
        group = EngineGroup(self.model, 2, ["--tp", "2"])
        port = group.grpc_ports[1]
        for variant, args in (
            ("no --grpc-port", without_option(group.for_node(1), "--grpc-port")),
            ("--grpc-mode", [*group.for_node(1), "--grpc-mode"]),
        ):
            with self.subTest(variant), cluster.nodes(args) as (follower,):
                self.assert_serves_nothing(follower, port)

    def test_rust_server_mode_is_left_to_upstream(self):
        group = EngineGroup(self.model, 2, ["--tp", "2"])
        port = group.grpc_ports[1]
        with (
            mock.patch.dict(os.environ, {"SGLANG_RUST_SERVER": "1"}),
            cluster.nodes(group.for_node(1)) as (follower,),
        ):
            if UPSTREAM_FOLLOWER_SERVER:
                self.assert_serves_nothing(follower, port)
            else:
                follower.expect_ready()
                self.assertEqual(follower.health(), cluster.SERVING)
                info = follower.server_info()
                self.assertEqual(info["node_rank"], 1)
                self.assertEqual(info["kv_event_sources"], [])


if __name__ == "__main__":
    unittest.main()
