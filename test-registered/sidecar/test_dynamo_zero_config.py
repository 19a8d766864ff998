"""``--sidecar dynamo.sglang.sidecar`` on a follower with no endpoint in ``--sidecar-args``,
through SGLang's real launch path.

NVIDIA Dynamo's released consumer (ai-dynamo 1.6.1, installed in every SGLang env by
``scripts/dynamo_env.py``) reads its endpoint only from ``--grpc-endpoint`` or
``DYN_SIDECAR_GRPC_ENDPOINT``; the overlay's supervisor sets the latter. A two-node attention-DP
group (``overlay_harness``: real ``Engine`` launch, stand-in model runner, real publishers) runs
the consumer on its follower with only the overlay's ``--sidecar-on-followers`` and Dynamo's
transport flags; the consumer must pass validation and wait for the group's leader, which a
Dynamo leader (it needs a real model) would be. No etcd or NATS: file discovery.
"""

import importlib.util
import os
import sys
import tempfile
import unittest
import uuid
from pathlib import Path
from unittest import mock

from overlay_harness import cluster, dynamo
from overlay_harness.cluster import EngineGroup
from overlay_harness.dynamo import DYNAMO, TRANSPORT_ARGS, WAITING_FOR_LEADER
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=68, suite="base-a-test-cpu")

CONSUMER_DEADLINE = 240.0
# Dynamo 1.6.1 checks ranks against the top-level dp_size, which 0.5.22+ reports as 1 here.
NEEDS_LEGACY_DP_SIZE = releases.adapter_for(releases.installed_sglang_version() or "0") == (
    "sglang_sidecar_overlay.adapters.v0_5_22"
)


class TestDynamoZeroConfig(CustomTestCase):
    def test_follower_consumer_gets_its_endpoint_without_sidecar_args(self):
        self.assertIsNotNone(importlib.util.find_spec(DYNAMO), "ai-dynamo must be installed")
        with tempfile.TemporaryDirectory(prefix="overlay-dynamo-") as workdir:
            model = cluster.write_tiny_model(Path(workdir) / "tiny-llama")
            group = EngineGroup(model, 2, ["--tp", "2", "--dp", "2", "--enable-dp-attention"])
            sidecar_args = [
                "--sidecar-on-followers",
                *TRANSPORT_ARGS,
                "--namespace", f"overlay-{uuid.uuid4().hex[:12]}",
            ]  # fmt: skip
            self.assertFalse(any("endpoint" in arg for arg in sidecar_args))
            env = dynamo.consumer_environ(Path(workdir), legacy=NEEDS_LEGACY_DP_SIZE)
            with (
                mock.patch.dict(os.environ, env, clear=True),
                cluster.nodes(group.for_node(0), group.for_node(1, DYNAMO, sidecar_args)) as (
                    leader,
                    follower,
                ),
            ):
                for node in (leader, follower):
                    node.expect_ready()

                def waiting_line() -> str | None:
                    text = follower.log_path.read_text(errors="replace")
                    if "exited with code" in text:
                        raise AssertionError(f"the consumer exited:\n{follower.log_tail(80)}")
                    return next((ln for ln in text.splitlines() if WAITING_FOR_LEADER in ln), None)

                line = cluster.wait_for(
                    waiting_line, CONSUMER_DEADLINE, "the released consumer to wait for the leader"
                )
                self.assertIn(f"dist_init:tcp://{group.dist_init_addr}", line)
                self.assertIn("node_rank=1", line)
                log = follower.log_path.read_text(errors="replace")
                started = next(ln for ln in log.splitlines() if f"sidecar {DYNAMO} started" in ln)
                self.assertIn(f"127.0.0.1:{group.grpc_ports[1]}", started)
                sys.stderr.write(f"{line}\n{started}\n")


if __name__ == "__main__":
    unittest.main()
