"""When a follower node gets the overlay's metadata server, and when its launch fails instead.

CPU-only: SGLang's real schedulers on the CPU test platform, every node its own host
(``overlay_harness.netns``) with this plugin loaded by SGLang's plugin framework. Each scenario
goes red when the overlay's gate or check it covers is gone:

- one four-node TP 4 group whose three followers each lack what the overlay's server needs:
  no ``--grpc-port``; legacy/SMG mode (``--grpc-mode``); ``SGLANG_RUST_SERVER=1``. The first
  two get no overlay metadata server and still launch (``_sglang.native_grpc_enabled``, which
  picks the follower's hook groups). With ``SGLANG_RUST_SERVER``, 0.5.22+ leave the follower to
  upstream, which starts no Python metadata server in that mode; 0.5.19-0.5.21 have no
  follower server of their own and the Rust server no gRPC listener, so the overlay's still
  serves (``docs/compatibility.md``). "Serves nothing" means nothing listens on the port
  (``/proc/net/tcp`` on the node) and the connection is refused, not just a failed RPC.
- the leader of that group with a connect-style publisher (``tcp://<its address>:P``, which
  SGLang's bind heuristic connects to): its reply lists no source, though its config has one;
- two ranks of a follower claiming one endpoint address: the follower's launch fails with
  ``SourceConflictError`` naming the address, and no scheduler is left behind. SGLang's rank
  offset never produces this; the ``shared_kv_endpoint`` fault
  (``overlay_harness.scheduler_faults``) drops the offset in the follower's real schedulers,
  so with an ``ipc://`` endpoint both ranks really bind and report one path. On the rebuilt
  wheel the follower's DP controller finds the conflict, and SGLang's SIGQUIT path kills the
  node, the error in its log (``patches/DIFFERENCES.md`` #10).
"""

import json
import signal
import time
import unittest

from overlay_harness import differences, nodes, probes
from overlay_harness.checks import report_launch
from overlay_harness.group import KV_TOPIC, EngineGroup
from overlay_harness.scheduler_faults import FAULT_ENV
from overlay_harness.testcase import NodesTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=150, suite="base-a-test-cpu")

# 0.5.22+ ship their own follower metadata server; the overlay replaces it except in
# SGLANG_RUST_SERVER mode.
UPSTREAM_FOLLOWER_SERVER = releases.adapter_for(releases.installed_sglang_version() or "0") == (
    "sglang_sidecar_overlay.adapters.v0_5_22"
)
FOLLOWER_SERVER_LOG = "follower metadata server"
STOP_DEADLINE = 120.0


class TestFollowerGating(NodesTestCase):
    def assert_serves_nothing(self, follower: nodes.Node, port: int):
        self.assertFalse(follower.inside(probes.tcp_listening, port), f"a listener on {port}")
        refused = follower.inside(probes.tcp_connect_error, f"tcp://{follower.address}:{port}")
        self.assertIn("ConnectionRefusedError", refused or "accepted")
        self.assertNotIn(FOLLOWER_SERVER_LOG, follower.log_text())

    def assert_connecting_publisher_not_advertised(self, leader: nodes.Node, endpoint: str):
        info = leader.server_info()
        self.assertEqual(info["kv_event_sources"], [], info)
        # Not for want of a publisher: the launch has one, and the reply says so.
        self.assertIn(endpoint, json.dumps(info.get("kv_events_config")))

    def test_followers_without_native_grpc_get_no_metadata_server(self):
        group = EngineGroup(4, ["--tp", "4"])
        # The leader's publisher (attention-TP rank 0) connects instead of binding: SGLang's
        # heuristic connects to a concrete host. Nothing listens for consumers on the leader's
        # side, so the leader must not advertise it.
        connect_to = f"tcp://{group.address(0)}:{group.kv_base}"
        connecting = json.dumps({"publisher": "zmq", "endpoint": connect_to, "topic": KV_TOPIC})
        launches = [
            group.launch(0, kv_events=connecting),
            group.launch(1, grpc=False),
            group.launch(2, extra=["--grpc-mode"]),
            group.launch(3, env={"SGLANG_RUST_SERVER": "1"}),
        ]
        names = ["leader", "no-grpc-port", "grpc-mode", "rust-server"]
        began = time.monotonic()
        with nodes.running(*launches, names=names, log_dir=self.workdir) as started:
            for node in started:
                node.expect_ready()
            report_launch("four nodes, TP 4", started, began)
            self.assert_connecting_publisher_not_advertised(started[0], connect_to)
            self.assert_serves_nothing(started[1], group.grpc_ports[1])
            self.assert_serves_nothing(started[2], group.grpc_ports[2])
            rust = started[3]
            if UPSTREAM_FOLLOWER_SERVER:
                self.assert_serves_nothing(rust, group.grpc_ports[3])
            else:
                self.assertEqual(rust.health(), nodes.SERVING)
                info = rust.server_info()
                self.assertEqual(info["node_rank"], 3)
                self.assertEqual(info["kv_event_sources"], [])

    def test_conflicting_sources_fail_the_follower_launch(self):
        group = EngineGroup(2, ["--tp", "4", "--dp", "4", "--enable-dp-attention"])
        shared = f"ipc://{self.workdir}/follower-kv"
        kv_events = json.dumps({"publisher": "zmq", "endpoint": shared, "topic": KV_TOPIC})
        follower_launch = group.launch(
            1, kv_events=kv_events, env={FAULT_ENV: "shared_kv_endpoint"}
        )
        with nodes.running(group.launch(0), follower_launch, log_dir=self.workdir) as started:
            follower = started[1]
            if differences.differs(differences.CONFLICT_IN_DP_CONTROLLER):
                # SGLang's SIGQUIT handler kills the node's tree: no launch error, a log line.
                # It comes once the follower's schedulers are ready, so after a whole launch.
                follower.proc.wait(timeout=nodes.NODE_READY_DEADLINE + STOP_DEADLINE)
                self.assertEqual(follower.proc.returncode, -signal.SIGKILL)
                error = next(
                    (ln for ln in follower.log_text().splitlines() if "ConflictError: " in ln), ""
                )
                self.assertIn(f"address {shared} is claimed by two KV event sources", error)
            else:
                event = follower.ready()
                self.assertEqual(event["event"], "error", follower.log_tail())
                error = event["error"]
                self.assertIn(f"address {shared} is claimed by two KV sources", error)
                follower.proc.wait(timeout=STOP_DEADLINE)
                self.assertNotEqual(follower.proc.returncode, 0)
            self.assertIn("SourceConflictError", error)
            self.assertIsNone(follower.health())
            follower.wait_gone()


if __name__ == "__main__":
    unittest.main()
