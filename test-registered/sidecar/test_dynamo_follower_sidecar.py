"""NVIDIA Dynamo's released SGLang sidecar (ai-dynamo 1.6.1) as a follower node's ``--sidecar``.

CPU-only: no model, no GPU and no scheduler run here. A follower node is stood in for by what
the released consumer can see of one: a real ZMQ PUB socket bound on loopback as the node's only
KV-event publisher (global DP rank 1), the overlay's own follower metadata server (the native
``GetServerInfo`` + health server) serving a snapshot built by the core builder from
the server args each SGLang generation reports, and the released ``dynamo.sglang.sidecar``
module run through the overlay's ``SidecarSupervisor`` exactly as ``--sidecar`` runs it. The
consumer uses file discovery, the TCP request plane and the ZMQ event plane, so it needs no etcd
or NATS; with no Dynamo leader registered, a follower that passes validation stays in its wait
for the leader of its ``dist_init_addr`` group, which is the state these tests look for.

What the released consumer does with each snapshot:
- attention DP as 0.5.22+ reports it (``dp_size=1, attn_dp_size=2``): rejected with "KV source
  rank 1 is outside dp_size 1" unless the legacy ``dp_size`` switch reports the publisher-rank
  count; with the switch it waits for the leader;
- attention DP as 0.5.19-0.5.21 report it (``dp_size=2``) and ordinary DP: accepted as is;
- a follower with ``kv_event_sources: []``: refused, so the overlay must never launch it there;
- the metadata server going away while it waits: it exits within its 5 s re-check, so the node
  must stop the sidecar before its metadata server;
- the endpoint: 1.6.1 reads only ``--grpc-endpoint`` or ``DYN_SIDECAR_GRPC_ENDPOINT`` (which the
  overlay's supervisor sets, so no ``--sidecar-args`` are needed), never
  ``SGLANG_GRPC_ENDPOINT``, and refuses ``--sglang-endpoint`` in argv.

Requires ``ai-dynamo`` and ``ai-dynamo-runtime`` in the environment:
``python scripts/dynamo_env.py --python <env>/bin/python``.
"""

import contextlib
import importlib.util
import os
import socket
import sys
import tempfile
import threading
import time
import unittest
import uuid
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import zmq
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay._native import MetadataServer, start_metadata_server
from sglang_sidecar_overlay.contract import server_info
from sglang_sidecar_overlay.contract.incarnation import Incarnation
from sglang_sidecar_overlay.contract.sources import describe_source
from sglang_sidecar_overlay.sidecar.supervisor import (
    ENDPOINT_FLAG,
    SidecarOptions,
    SidecarSupervisor,
    build_sidecar_endpoint,
)

register_cpu_ci(est_time=8, suite="base-a-test-cpu")

PROVIDER = "dynamo.sglang.sidecar"
# No etcd, no NATS: discovery through files in a private directory.
TRANSPORT_ARGS = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
# Import of the 200 MB runtime extension included; generous for a loaded 2-core machine.
STARTUP_DEADLINE = 90.0
SHUTDOWN_TIMEOUT = 10.0
PAGE_SIZE = 16

WAITING_FOR_LEADER = "Waiting for SGLang leader for local KV publishing"
RANK_OUTSIDE_DP_SIZE = "KV source rank 1 is outside dp_size 1"
NO_LOCAL_SOURCES = "telemetry-only node has no local KV sources"

# Server args of a two-node follower (node_rank 1) as each generation reports them.
COMMON_ARGS = {
    "model_path": "stand-in/no-model",
    "host": "127.0.0.1",
    "nnodes": 2,
    "node_rank": 1,
    "tp_size": 2,
    "page_size": PAGE_SIZE,
    "disaggregation_mode": "null",
    "incremental_streaming_output": True,
}
ATTENTION_DP_0522 = {"dp_size": 1, "attn_dp_size": 2, "enable_dp_attention": True}
ATTENTION_DP_0521 = {"dp_size": 2, "enable_dp_attention": True}
ORDINARY_DP = {"dp_size": 2, "attn_dp_size": 1, "enable_dp_attention": False}

# Variables that would point the consumer somewhere other than this test's private setup.
_DYNAMO_ENV_PREFIXES = ("DYN_", "NATS_", "ETCD_")


def _consumer_installed() -> bool:
    try:
        return importlib.util.find_spec(PROVIDER) is not None
    except ModuleNotFoundError:
        return False


@contextlib.contextmanager
def _spawned_output_to(path: Path) -> Iterator[None]:
    """Point fds 1 and 2 at ``path`` while a child is spawned, so it inherits the file."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = (os.dup(1), os.dup(2))
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


class TestDynamoFollowerSidecar(CustomTestCase):
    """The released consumer against the overlay's follower metadata server."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        if not _consumer_installed():
            raise AssertionError(
                f"{PROVIDER} is not importable; install the released consumer with "
                "`python scripts/dynamo_env.py --python <this environment's python>`"
            )

    def setUp(self) -> None:
        super().setUp()
        workdir = tempfile.TemporaryDirectory(prefix="dynamo-follower-")
        self.addCleanup(workdir.cleanup)
        self.workdir = Path(workdir.name)
        self.consumers_started = 0

        context = zmq.Context()
        self.addCleanup(context.destroy, linger=0)
        self.publisher = context.socket(zmq.PUB)
        self.publisher.setsockopt(zmq.LINGER, 0)
        self.addCleanup(self.publisher.close, linger=0)
        self.publisher.bind("tcp://127.0.0.1:*")
        self.bound_endpoint = self.publisher.getsockopt_string(zmq.LAST_ENDPOINT)

        # The leader's rendezvous address; nothing listens there, the consumer only resolves it.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            rendezvous_port = probe.getsockname()[1]
        self.dist_init_addr = f"127.0.0.1:{rendezvous_port}"

        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(_DYNAMO_ENV_PREFIXES)
        }
        env.update(
            DYN_FILE_KV=str(self.workdir / "discovery"),
            DYN_LOG="info",
            DYN_SDK_DISABLE_ANSI_LOGGING="1",
            NO_COLOR="1",
        )
        patcher = mock.patch.dict(os.environ, env, clear=True)
        patcher.start()
        self.addCleanup(patcher.stop)

    # -- the stand-in follower -------------------------------------------------------------

    def serve_follower(
        self, parallelism: dict, *, legacy_dp_size: bool, with_source: bool = True
    ) -> str:
        """Start the follower metadata server for this node; returns the sidecar endpoint."""
        server_args = {**COMMON_ARGS, **parallelism, "dist_init_addr": self.dist_init_addr}
        sources = []
        if with_source:
            source = describe_source(1, self.bound_endpoint, "", PAGE_SIZE)
            self.assertIsNotNone(source)
            sources.append(source)
        info = server_info.build_server_info(
            server_args,
            {"status": "ready", "max_total_num_tokens": 4096},
            launch_command="python -m sglang.launch_server --nnodes 2 --node-rank 1",
            kv_event_sources=sources,
            legacy_dp_size=legacy_dp_size,
            incarnation=Incarnation.new(),
        )
        self.served_info = info
        server: MetadataServer = start_metadata_server(
            "127.0.0.1", 0, server_info.render_server_info(info)
        )
        self.addCleanup(server.shutdown)
        server.set_serving(True)
        return build_sidecar_endpoint(server.host, server.port)

    def start_consumer(
        self, endpoint: str, *, pass_grpc_endpoint: bool = True, endpoint_in_argv: bool = False
    ) -> SidecarSupervisor:
        """Run the released consumer under the overlay's supervisor, as ``--sidecar`` does."""
        provider_args = [*TRANSPORT_ARGS, "--namespace", f"overlay-{uuid.uuid4().hex[:12]}"]
        if pass_grpc_endpoint:
            provider_args += ["--grpc-endpoint", endpoint]
        self.fatal = threading.Event()
        self.fatal_reasons: list[str] = []

        def on_fatal(description: str) -> None:
            self.fatal_reasons.append(description)
            self.fatal.set()

        supervisor = SidecarSupervisor(
            PROVIDER,
            endpoint,
            provider_args,
            SidecarOptions(shutdown_timeout=SHUTDOWN_TIMEOUT),
            on_fatal,
            endpoint_in_argv=endpoint_in_argv,
        )
        self.addCleanup(supervisor.stop)
        # A fresh log per start, so nothing an earlier consumer wrote can satisfy a check.
        self.consumers_started += 1
        self.log_path = self.workdir / f"consumer-{self.consumers_started}.log"
        self.log_path.touch()
        self.started_at = time.monotonic()
        with _spawned_output_to(self.log_path):
            supervisor.start()
        return supervisor

    # -- observations ------------------------------------------------------------------------

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str) -> str:
        """The first log line containing ``text``; fails if the consumer exits first."""
        deadline = self.started_at + STARTUP_DEADLINE
        while True:
            for line in self.log_text().splitlines():
                if text in line:
                    return line
            if self.fatal.is_set():
                self.fail(f"the consumer exited before logging {text!r}:\n{self.log_text()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.fail(f"no {text!r} within {STARTUP_DEADLINE} s:\n{self.log_text()}")
            # Wakes at once when the consumer dies; otherwise re-reads the log.
            self.fatal.wait(min(0.1, remaining))

    def wait_for_refusal(self, text: str, *, after_wait: bool = False) -> str:
        """The consumer exits non-zero on its own and its output contains ``text``.

        Unless ``after_wait``, it must not have reached its wait for the leader first.
        """
        if not self.fatal.wait(STARTUP_DEADLINE):
            self.fail(
                f"the consumer is still running after {STARTUP_DEADLINE} s:\n{self.log_text()}"
            )
        output = self.log_text()
        self.assertIn(text, output)
        self.assertIn("exited with code", self.fatal_reasons[0])
        if not after_wait:
            self.assertNotIn(WAITING_FOR_LEADER, output)
        return next(line for line in output.splitlines() if text in line)

    def assert_waits_for_leader_and_stops(self, supervisor: SidecarSupervisor) -> str:
        line = self.wait_for_log(WAITING_FOR_LEADER)
        self.assertIn("node_rank=1", line)
        self.assertIn(f'group="dist_init:tcp://{self.dist_init_addr}"', line)
        self.assertTrue(supervisor.is_alive())
        stop_began = time.monotonic()
        supervisor.stop()
        self.assertLess(time.monotonic() - stop_began, SHUTDOWN_TIMEOUT + 1.0)
        self.assertFalse(supervisor.is_alive())
        # A stop we asked for is not a crash.
        self.assertEqual(self.fatal_reasons, [])
        return line

    # -- scenarios ----------------------------------------------------------------------------

    def test_attention_dp_0522_shape_is_rejected_without_switch(self) -> None:
        endpoint = self.serve_follower(ATTENTION_DP_0522, legacy_dp_size=False)
        self.assertEqual(self.served_info["dp_size"], 1)
        self.start_consumer(endpoint)
        self.wait_for_refusal(RANK_OUTSIDE_DP_SIZE)

    def test_attention_dp_0522_shape_waits_for_leader_with_switch(self) -> None:
        endpoint = self.serve_follower(ATTENTION_DP_0522, legacy_dp_size=True)
        self.assertEqual(self.served_info["dp_size"], 2)
        self.assertEqual(self.served_info["attn_dp_size"], 2)
        self.assertEqual(self.served_info["kv_event_rank_space"]["size"], 2)
        supervisor = self.start_consumer(endpoint)
        self.assert_waits_for_leader_and_stops(supervisor)

    def test_attention_dp_0521_shape_needs_no_switch(self) -> None:
        endpoint = self.serve_follower(ATTENTION_DP_0521, legacy_dp_size=False)
        supervisor = self.start_consumer(endpoint)
        self.assert_waits_for_leader_and_stops(supervisor)

    def test_ordinary_dp_needs_no_switch(self) -> None:
        endpoint = self.serve_follower(ORDINARY_DP, legacy_dp_size=False)
        supervisor = self.start_consumer(endpoint)
        self.assert_waits_for_leader_and_stops(supervisor)

    def test_follower_without_publisher_is_refused(self) -> None:
        for legacy_dp_size in (False, True):
            with self.subTest(legacy_dp_size=legacy_dp_size):
                endpoint = self.serve_follower(
                    ATTENTION_DP_0522, legacy_dp_size=legacy_dp_size, with_source=False
                )
                self.assertEqual(self.served_info["kv_event_sources"], [])
                self.start_consumer(endpoint)
                self.wait_for_refusal(NO_LOCAL_SOURCES)

    def test_consumer_exits_when_metadata_server_goes_away(self) -> None:
        """It re-reads GetServerInfo while waiting: the server must outlive the sidecar."""
        server_args = {**COMMON_ARGS, **ATTENTION_DP_0521, "dist_init_addr": self.dist_init_addr}
        source = describe_source(1, self.bound_endpoint, "", PAGE_SIZE)
        info = server_info.build_server_info(
            server_args, {}, kv_event_sources=[source], incarnation=Incarnation.new()
        )
        server = start_metadata_server("127.0.0.1", 0, server_info.render_server_info(info))
        self.addCleanup(server.shutdown)
        server.set_serving(True)
        self.start_consumer(build_sidecar_endpoint(server.host, server.port))
        self.wait_for_log(WAITING_FOR_LEADER)
        server.shutdown()
        self.wait_for_refusal("local SGLang metadata server unavailable", after_wait=True)

    def test_supervisor_passes_the_endpoint_no_sidecar_args_needed(self) -> None:
        """1.6.1 reads DYN_SIDECAR_GRPC_ENDPOINT, which the overlay's supervisor sets; it reads
        neither SGLANG_GRPC_ENDPOINT nor ``--sglang-endpoint``."""
        endpoint = self.serve_follower(ATTENTION_DP_0521, legacy_dp_size=False)
        with self.subTest("no --grpc-endpoint: the supervisor's DYN_SIDECAR_GRPC_ENDPOINT"):
            supervisor = self.start_consumer(endpoint, pass_grpc_endpoint=False)
            self.wait_for_log(WAITING_FOR_LEADER)
            supervisor.stop()
        with self.subTest("endpoint flag in argv"):
            self.start_consumer(endpoint, endpoint_in_argv=True)
            self.wait_for_refusal(f"unexpected argument '{ENDPOINT_FLAG}'")
            self.assertIn("exited with code 2", self.fatal_reasons[0])


if __name__ == "__main__":
    unittest.main()
