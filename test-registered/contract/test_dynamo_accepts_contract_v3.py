"""The released Dynamo sidecar (ai-dynamo 1.6.1) accepts a follower serving contract 3.

CPU-only; no SGLang engine is launched. The overlay's own follower metadata server (the native
module, as a follower node runs it) serves a follower's server info built by the contract's
builder with every contract-3 field: each source's ``replay_buffer_steps``, ``hwm`` and
``max_queue_size`` next to ``encoding``, ``incarnation`` and ``contract_version: 3``. The
released consumer, ``python -m dynamo.sglang.sidecar`` in follower mode with file discovery (no
etcd, no NATS), reads it and, having accepted it, waits for the leader of its group, which
never comes. The control: the same follower under attention DP as 0.5.22+ report it
(``dp_size: 1``, ``attn_dp_size: 2``, the legacy switch off) is rejected with the known
"outside dp_size" error, so the consumer does validate what it is served.

Self-contained (no ``overlay_harness``): it should move onto the rewritten harness.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import uuid
from pathlib import Path

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay.contract.incarnation import CONTRACT_VERSION, Incarnation
from sglang_sidecar_overlay.contract.server_info import build_server_info, render_server_info
from sglang_sidecar_overlay.contract.sources import describe_source
from sglang_sidecar_overlay.server.follower import start_follower_server

register_cpu_ci(est_time=10, suite="base-a-test-cpu")

DYNAMO = "dynamo.sglang.sidecar"
ACCEPTED = "Waiting for SGLang leader for local KV publishing"
REJECTED = "KV source rank 1 is outside dp_size 1"
# Import of the consumer's ~200 MB runtime extension included, on a loaded 2-core machine.
DEADLINE = 240.0
BOUNDS = {"replay_buffer_steps": 777, "hwm": 5000, "max_queue_size": 3000}


def follower_info(*, dp_size: int = 2, attn_dp_size: int = 1) -> str:
    """A follower's server info as the builder makes it: rank 1 of a two-rank group."""
    source = describe_source(
        1, "tcp://127.0.0.1:47001", "kv", 16, "tcp://127.0.0.1:47101", bounds=BOUNDS
    )
    args = {
        "node_rank": 1,
        "nnodes": 2,
        "dist_init_addr": "192.0.2.10:5000",
        "dp_size": dp_size,
        "attn_dp_size": attn_dp_size,
        "page_size": 16,
        "dcp_size": 1,
        "disaggregation_mode": "null",
    }
    info = build_server_info(
        args, {"status": "ready"}, incarnation=Incarnation.new(), kv_event_sources=[source]
    )
    return render_server_info(info)


class TestDynamoAcceptsContractV3(CustomTestCase):
    def setUp(self):
        self.workdir = Path(tempfile.mkdtemp(prefix="dynamo-v3-"))
        self.procs: list[subprocess.Popen] = []
        self.servers = []

    def tearDown(self):
        try:
            for proc in self.procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            for server in self.servers:
                server.stop()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def serve(self, info_json: str) -> int:
        # Port 0: the server reports the port it bound.
        server = start_follower_server("127.0.0.1", 0, info_json, [os.getpid()])
        self.servers.append(server)
        return server.port

    def consumer_output_until(self, port: int, *markers: str) -> str:
        """Run the consumer against ``port``; its output up to the first marker or its exit."""
        environ = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("DYN_", "NATS_", "ETCD_"))
        }
        environ.update(
            DYN_FILE_KV=str(self.workdir / f"discovery-{uuid.uuid4().hex}"),
            DYN_LOG="info",
            DYN_SDK_DISABLE_ANSI_LOGGING="1",
            NO_COLOR="1",
        )
        command = [
            sys.executable, "-m", DYNAMO,
            "--grpc-endpoint", f"http://127.0.0.1:{port}",
            "--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq",
            "--namespace", f"overlay-{uuid.uuid4().hex[:12]}",
        ]  # fmt: skip
        log = self.workdir / f"consumer-{len(self.procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=environ, start_new_session=True
            )
        self.procs.append(proc)
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if any(marker in text for marker in markers) or proc.poll() is not None:
                return log.read_text(errors="replace")
            time.sleep(0.2)
        self.fail(f"the consumer printed none of {markers} within {DEADLINE:.0f} s:\n{text}")

    def test_a_contract_3_follower_is_accepted(self):
        self.assertEqual(CONTRACT_VERSION, 3)
        info = follower_info()
        for key, value in BOUNDS.items():
            self.assertIn(f'"{key}": {value}', info)
        output = self.consumer_output_until(self.serve(info), ACCEPTED, REJECTED)
        self.assertIn(ACCEPTED, output)
        self.assertNotIn(REJECTED, output)

    def test_the_consumer_validates_what_it_reads(self):
        info = follower_info(dp_size=1, attn_dp_size=2)
        output = self.consumer_output_until(self.serve(info), ACCEPTED, REJECTED)
        self.assertIn(REJECTED, output)
        self.assertNotIn(ACCEPTED, output)


if __name__ == "__main__":
    unittest.main()
