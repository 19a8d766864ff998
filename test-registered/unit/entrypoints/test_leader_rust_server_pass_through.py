"""With ``SGLANG_RUST_SERVER`` set, the leader's hooks hand each call to upstream's original.

CPU-only, in process, no server socket: the hooks a native-gRPC leader with ``--sidecar``
installs (``leader_grpc`` and ``leader_sidecar``), through SGLang's own ``HookRegistry``
(``overlay_harness.in_process``), each called with and without the variable:

- ``RuntimeHandle.get_server_info`` on a handle holding a leader's launch-time state (as in
  ``test_leader_grpc_server_info``): in that mode upstream's reply, unchanged (no core key such
  as ``kv_event_rank_space``) and nothing cached on the handle; without it the core's reply.
- ``sglang.srt.entrypoints.sidecar.start_sidecar``, looked up on the module when called, as
  SGLang's callers do (0.5.23's ``rust_server_sidecar`` in that mode, the HTTP lifespan
  otherwise), with the serving config of a leader launched with ``--sidecar`` active: in that
  mode upstream's own ``Sidecar`` over a spawned process; without it the overlay's
  ``NodeSidecar`` over its supervisor. Either runs the provider ``security.sidecar_dump``,
  which records its pid once ``main`` runs, and is stopped at cleanup.

0.5.19-0.5.21: skipped by design. Their Rust server has no gRPC listener, so their leader in
that mode serves no ``GetServerInfo`` of the overlay's and never reaches ``start_sidecar``
(``docs/compatibility.md``, "``SGLANG_RUST_SERVER`` mode").
"""

import contextlib
import importlib
import inspect
import json
import os
import signal
import tempfile
import time
import unittest
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from overlay_harness import in_process, ports
from overlay_harness.group import TINY_MODEL
from overlay_harness.in_process import SOURCES
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=14, suite="base-a-test-cpu")

RUST_SERVER = "SGLANG_RUST_SERVER"
# The adapter whose leader hooks leave this mode to upstream (0.5.22+).
PASS_THROUGH = releases.adapter_for(releases.installed_sglang_version() or "0") == (
    "sglang_sidecar_overlay.adapters.v0_5_22"
)
SKIP_REASON = "0.5.19-0.5.21: the leader's gRPC port is unused in SGLANG_RUST_SERVER mode"
PROVIDER = "security.sidecar_dump"
# A spawned upstream sidecar imports SGLang before it runs the provider.
SIDECAR_DEADLINE = 120.0
CORE_KEYS = ("kv_event_rank_space", "contract_version")


@contextlib.contextmanager
def rust_server(enabled: bool) -> Iterator[None]:
    """``SGLANG_RUST_SERVER=1`` for the block, or the variable unset."""
    with mock.patch.dict(os.environ):
        os.environ.pop(RUST_SERVER, None)
        if enabled:
            os.environ[RUST_SERVER] = "1"
        yield


def wait_for_dump(prefix: Path) -> dict:
    """The record ``security.sidecar_dump`` writes once its ``main`` runs."""
    deadline = time.monotonic() + SIDECAR_DEADLINE
    while True:
        found = sorted(prefix.parent.glob(f"{prefix.name}.*[0-9].json"))
        if found:
            return json.loads(found[0].read_text())
        if time.monotonic() > deadline:
            raise AssertionError(f"the provider did not start within {SIDECAR_DEADLINE} s")
        time.sleep(0.05)


@unittest.skipUnless(PASS_THROUGH, SKIP_REASON)
class TestLeaderRustServerPassThrough(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server_args = in_process.leader_with_launch_hooks(["leader_grpc", "leader_sidecar"])

    def _handle(self):
        return in_process.leader_runtime_handle(self.server_args, SOURCES)

    def _upstream_reply(self) -> dict:
        from sglang.srt.entrypoints.grpc_bridge import RuntimeHandle

        return json.loads(inspect.unwrap(RuntimeHandle.get_server_info)(self._handle()))

    def test_server_info_in_rust_server_mode_is_upstreams_reply(self):
        handle = self._handle()
        state = dict(vars(handle))
        with rust_server(True):
            info = json.loads(handle.get_server_info())
        self.assertFalse(info.keys() & set(CORE_KEYS), "core keys in the reply")
        self.assertEqual(info, self._upstream_reply())
        self.assertEqual(vars(handle), state, "the reply was cached on the handle")

    def test_server_info_without_rust_server_is_the_cores(self):
        handle = self._handle()
        state = dict(vars(handle))
        with rust_server(False):
            info = json.loads(handle.get_server_info())
        self.assertEqual(info["kv_event_rank_space"]["local_ranks"], [0, 1])
        self.assertIn("contract_version", info)
        self.assertNotEqual(info, self._upstream_reply())
        self.assertGreater(vars(handle).keys(), state.keys())  # built once, then cached

    def _start_sidecar(self, rust: bool):
        """``start_sidecar()`` as SGLang calls it, under a leader's serving config with
        ``--sidecar``; returns what it returned and the provider's record."""
        from sglang.srt.runtime_context import create_context, use_context
        from sglang.srt.server_args import prepare_server_args

        workdir = tempfile.TemporaryDirectory()
        self.addCleanup(workdir.cleanup)
        dump = Path(workdir.name) / "sidecar"
        server_args = prepare_server_args(
            ["--model-path", str(TINY_MODEL), "--skip-tokenizer-init", "--device", "cpu",
             "--host", "127.0.0.1", "--grpc-port", str(ports.free_port()),
             "--sidecar", PROVIDER, "--sidecar-args", json.dumps(["--dump", str(dump)])]
        )  # fmt: skip
        # Both sidecars SIGQUIT this process if their provider dies on its own: recorded here
        # (a test failure) instead of ending the session.
        quits = []
        previous = signal.signal(signal.SIGQUIT, lambda signum, frame: quits.append(signum))
        self.addCleanup(signal.signal, signal.SIGQUIT, previous)
        self.addCleanup(lambda: self.assertEqual(quits, [], "a sidecar SIGQUIT the server"))
        context = create_context(server_args, role="tokenizer")
        in_process.begin_launch(server_args)
        module = importlib.import_module("sglang.srt.entrypoints.sidecar")
        with use_context(context), rust_server(rust):
            sidecar = module.start_sidecar()
        self.addCleanup(sidecar.stop)
        return sidecar, wait_for_dump(dump)

    def test_start_sidecar_in_rust_server_mode_is_upstreams(self):
        from sglang.srt.entrypoints.sidecar import Sidecar

        sidecar, record = self._start_sidecar(rust=True)
        self.assertIs(type(sidecar), Sidecar)
        # Upstream's sidecar process runs the provider's main itself.
        self.assertEqual(record["pid"], sidecar.proc.pid)
        sidecar.stop()
        self.assertEqual(sidecar.proc.exitcode, 0)  # the provider's own exit on SIGTERM

    def test_start_sidecar_without_rust_server_is_the_overlays(self):
        from sglang_sidecar_overlay.adapters._sidecar import NodeSidecar

        sidecar, record = self._start_sidecar(rust=False)
        self.assertIs(type(sidecar), NodeSidecar)
        # The overlay's shim leads the sidecar's session and forks the provider.
        self.assertEqual(record["ppid"], sidecar.pid)
        sidecar.stop()
        self.assertFalse(sidecar.supervisor.is_alive())


if __name__ == "__main__":
    unittest.main()
