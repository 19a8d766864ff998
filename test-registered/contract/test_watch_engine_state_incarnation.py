"""The node's ``incarnation`` against upstream's ``WatchEngineState`` instance id, on real leaders.

CPU-only, SGLang 0.5.23. Launches a real single-node leader (``python -m sglang.launch_server``
with the real scheduler on the CPU test platform, dummy weights of a tiny Qwen3, native
``--grpc-port`` and a ZMQ KV-event publisher), twice, and calls the leader's real native gRPC
``WatchEngineState`` and ``GetServerInfo`` (upstream's ``_grpc`` server; raw gRPC, the replies
decoded from the protobuf wire format here):

- a snapshot's ``instance_id`` (field 1, uint64) is chosen once per launch: it is the same in
  every snapshot of the launch, across a revision change (pause, then continue generation);
  it is a Unix time in nanoseconds after the launch's ``incarnation.started_at``;
- every snapshot's ``server_info`` (field 6, a ``GetServerInfoResponse``) is this contract's
  object, whose ``incarnation`` equals the one ``GetServerInfo`` answers: the two identities
  are paired in every snapshot;
- a relaunch gets a new instance id and a new incarnation, paired again.

With the plugin (stock SGLang) or without it (the rebuilt wheel from ``patches/``, where
``SGLANG_OVERLAY_TEST_PLUGINS=none``): both report the incarnation.

Self-contained (no ``overlay_harness``): it should move onto the rewritten harness.
"""

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request
from pathlib import Path

import grpc
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay import releases
from sglang_sidecar_overlay.contract.incarnation import CONTRACT_VERSION

register_cpu_ci(est_time=60, suite="base-a-test-cpu")

SERVICE = "/sglang.runtime.v1.SglangService"
READY_DEADLINE = 300.0
RPC_TIMEOUT = 30.0
STOP_DEADLINE = 60.0
TINY_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# EngineStateSnapshot fields (0.5.23's _grpc): instance_id, revision, server_info.
INSTANCE_ID, REVISION, SERVER_INFO = 1, 2, 6


# --- protobuf wire format: just enough to read the two replies ---------------------------------


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def decode_fields(data: bytes) -> dict[int, int | bytes]:
    """``{field number: value}`` of a message's varint and length-delimited fields."""
    fields: dict[int, int | bytes] = {}
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            fields[number], at = _varint(data, at)
        elif wire_type == 2:
            length, at = _varint(data, at)
            fields[number], at = data[at : at + length], at + length
        elif wire_type in (1, 5):
            width = 8 if wire_type == 1 else 4
            fields[number], at = data[at : at + width], at + width
        else:
            raise ValueError(f"wire type {wire_type} of field {number}")
    return fields


def json_info(server_info_response: bytes) -> dict:
    """The ``json_info`` (field 1) of a ``GetServerInfoResponse``, parsed."""
    return json.loads(decode_fields(server_info_response)[1])


# --- ports and the leader ----------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """Ports free right now, below the ephemeral range, in this session's share of it."""
    low, high = 10000, 30000
    with contextlib.suppress(OSError, ValueError):
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        high = min(high, first) if first > 12000 else high
    share = os.environ.get("SGLANG_OVERLAY_TEST_PORT_SHARE")
    if share:
        index, total = (int(part) for part in share.split("/"))
        width = (high - low) // total
        low, high = low + index * width, low + (index + 1) * width
    picked: list[int] = []
    rng = random.SystemRandom()
    while len(picked) < count:
        port = rng.randrange(low, high)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in picked:
            picked.append(port)
    return picked


class Leader:
    """One ``launch_server`` process group: a real single-node leader."""

    def __init__(self, model: Path, log: Path):
        self.http_port, self.grpc_port, kv_port = free_ports(3)
        kv_events = {"publisher": "zmq", "endpoint": f"tcp://*:{kv_port}", "topic": "kv"}
        command = [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", str(model), "--load-format", "dummy", "--device", "cpu",
            "--skip-tokenizer-init", "--attention-backend", "torch_native",
            "--disable-cuda-graph", "--dtype", "float32", "--mem-fraction-static", "0.05",
            "--max-total-tokens", "4096", "--page-size", "16", "--host", "127.0.0.1",
            "--port", str(self.http_port), "--grpc-port", str(self.grpc_port),
            "--kv-events-config", json.dumps(kv_events),
        ]  # fmt: skip
        environ = dict(os.environ)
        environ["SGLANG_PLATFORM"] = "overlay_cpu"
        environ["SGLANG_PLUGINS"] = os.environ.get("SGLANG_OVERLAY_TEST_PLUGINS", "sidecar_overlay")
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=environ, start_new_session=True
            )
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_DEADLINE
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the leader exited ({self.proc.returncode}):\n{self.tail()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url("/health"), timeout=5) as reply,
            ):
                if reply.status == 200:
                    return
            time.sleep(1.0)
        raise AssertionError(f"the leader was not healthy within {READY_DEADLINE:.0f} s")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    def post(self, path: str) -> None:
        request = urllib.request.Request(
            self.url(path), data=b"{}", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=RPC_TIMEOUT) as reply:
            assert reply.status == 200, (path, reply.status)

    def server_info(self) -> dict:
        call = self.channel.unary_unary(
            f"{SERVICE}/GetServerInfo",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        return json_info(call(b"", timeout=RPC_TIMEOUT))

    def snapshot(self) -> dict[int, int | bytes]:
        """The first snapshot a new ``WatchEngineState`` stream sends: the current state."""
        call = self.channel.unary_stream(
            f"{SERVICE}/WatchEngineState",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        stream = call(b"", timeout=RPC_TIMEOUT)
        try:
            return decode_fields(next(stream))
        finally:
            stream.cancel()

    def stop(self) -> None:
        self.channel.close()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=STOP_DEADLINE)
        # Whatever is left of the group (schedulers, detokenizer) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_DEADLINE)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@unittest.skipUnless(
    releases.installed_sglang_version() == "0.5.23"
    or (releases.installed_sglang_version() or "").startswith("0.5.23+"),
    "WatchEngineState's snapshot layout is checked on SGLang 0.5.23 only",
)
class TestWatchEngineStateIncarnation(CustomTestCase):
    def setUp(self):
        self.workdir = Path(tempfile.mkdtemp(prefix="watch-incarnation-"))
        (self.workdir / "model").mkdir()
        (self.workdir / "model" / "config.json").write_text(json.dumps(TINY_QWEN3))
        self.leaders: list[Leader] = []

    def tearDown(self):
        try:
            for leader in self.leaders:
                leader.stop()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def launch(self) -> Leader:
        leader = Leader(self.workdir / "model", self.workdir / f"leader-{len(self.leaders)}.log")
        self.leaders.append(leader)
        leader.wait_ready()
        return leader

    def paired(self, leader: Leader) -> tuple[int, int, dict]:
        """(instance id, revision, incarnation) of one snapshot, checked against GetServerInfo."""
        snapshot = leader.snapshot()
        info = leader.server_info()
        embedded = json_info(snapshot[SERVER_INFO])
        self.assertEqual(info["contract_version"], CONTRACT_VERSION)
        self.assertEqual(embedded["incarnation"], info["incarnation"])
        return snapshot[INSTANCE_ID], snapshot[REVISION], info["incarnation"]

    def test_instance_id_and_incarnation_change_together_once_per_launch(self):
        first = self.launch()
        instance, revision, incarnation = self.paired(first)
        self.assertGreater(instance, 0)
        # A Unix time in ns, taken when the gRPC server started, after the launch began.
        self.assertLess(incarnation["started_at"], instance / 1e9)
        self.assertLess(instance / 1e9, time.time())

        first.post("/pause_generation")
        first.post("/continue_generation")
        deadline = time.monotonic() + RPC_TIMEOUT
        later = revision
        while later <= revision and time.monotonic() < deadline:
            again, later, same = self.paired(first)
            self.assertEqual((again, same), (instance, incarnation))
            time.sleep(0.2)
        self.assertGreater(later, revision, "pause and continue did not change the revision")

        first.stop()
        second = self.launch()
        relaunched, _, new_incarnation = self.paired(second)
        self.assertNotEqual(relaunched, instance)
        self.assertGreater(relaunched, instance)
        self.assertNotEqual(new_incarnation["id"], incarnation["id"])


if __name__ == "__main__":
    unittest.main()
