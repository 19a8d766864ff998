"""NVIDIA Dynamo's released SGLang sidecar (ai-dynamo 1.6.1) on real follower nodes.

CPU-only. Each test launches a two-node attention-DP group (``--tp 2 --dp 2
--enable-dp-attention``) through SGLang's real launch path (``overlay_harness.node``:
``Engine._launch_subprocesses`` with the stand-in scheduler as the only stand-in, the real DP
controller, follower branch and ``ZmqEventPublisher``). The follower runs ``--sidecar
dynamo.sglang.sidecar`` with ``--sidecar-on-followers``, so the overlay starts the released
consumer against the follower's own metadata server, as it would on a cluster. What the
consumer reads is what that follower serves: nothing here is built by hand. The consumer uses
file discovery (``DYN_FILE_KV``), the TCP request plane and the ZMQ event plane, with a unique
namespace, so it needs no etcd or NATS; with no Dynamo leader registered (one needs a real
model), an accepted follower stays in its wait for the leader of its ``dist_init_addr`` group.

Scenarios, on every release:
- attention DP with ``SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE=1``, endpoint in ``--grpc-endpoint``:
  the follower reports ``dp_size=2`` and the consumer waits for the leader; then the follower's
  engine process is killed (SIGKILL, so no orderly stop: its metadata server goes away with it)
  and the consumer ends with it: it receives SIGTERM and no process of it is left;
- attention DP with the switch off, no endpoint in ``--sidecar-args`` (the consumer reads the
  ``DYN_SIDECAR_GRPC_ENDPOINT`` the supervisor sets, and reaches the follower with it either
  way: a rejection is of what the follower served): 0.5.22+ report ``dp_size=1`` and the
  consumer rejects the follower ("KV source rank 1 is outside dp_size 1"), which brings the
  follower down; 0.5.19-0.5.21 report ``dp_size=2`` and it waits, then ends with its follower
  as above.

Covered elsewhere through real followers, not repeated here: the orderly stop (sidecar stopped
before the metadata server) and the switch set only where needed
(``test_sidecar_launch.py``, ``run_follower_consumer``); the TP-only follower, which owns no
publisher and never gets the consumer (``entrypoints/test_follower_metadata.py``,
``test_follower_without_publisher_answers_empty_list_and_gets_no_sidecar``).

Each node is its own host (``overlay_harness.netns``): the consumer runs in the follower's
namespace, the only place the follower's loopback endpoints are reachable from.

Requires ``ai-dynamo`` and ``ai-dynamo-runtime`` in the environment (``scripts/sglang_envs.py``
installs them through ``scripts/dynamo_env.py``); a missing install fails the tests.
"""

import contextlib
import importlib.util
import os
import re
import signal
import sys
import time
import unittest
import uuid
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from overlay_harness import cluster, dynamo
from overlay_harness.cluster import EngineGroup
from overlay_harness.dynamo import DYNAMO, TRANSPORT_ARGS, WAITING_FOR_LEADER
from overlay_harness.testcase import TinyModelTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=89, suite="base-a-test-cpu")

ATTENTION_DP = ["--tp", "2", "--dp", "2", "--enable-dp-attention"]
# Import of the 200 MB runtime extension included; generous for a loaded 2-core machine.
CONSUMER_DEADLINE = 240.0
STOP_DEADLINE = 90.0
GONE_DEADLINE = 60.0

RANK_OUTSIDE_DP_SIZE = "KV source rank 1 is outside dp_size 1"
CONSUMER_SIGTERM = "SIGTERM received"
# The supervisor's report of an exit nobody asked for.
CONSUMER_EXITED = f"sidecar '{DYNAMO}' exited"
# The supervisor's shim runs as ``python -c ... sglang-sidecar:<module>``; the provider is a
# fork of it, so both carry this in their command line.
SHIM_MARKER = f"sglang-sidecar:{DYNAMO}".encode()
RELEASE = releases.installed_sglang_version() or ""
# 0.5.22+ report attention DP as dp_size=1, which Dynamo 1.6.1 checks source ranks against.
ATTENTION_DP_REPORTS_DP_SIZE_1 = releases.adapter_for(RELEASE or "0") == (
    "sglang_sidecar_overlay.adapters.v0_5_22"
)


def _consumer_installed() -> bool:
    with contextlib.suppress(ImportError, ValueError):
        return importlib.util.find_spec(DYNAMO) is not None
    return False


def consumer_pids(tag: str, shim_pid: int) -> list[int]:
    """Live processes of the node's consumer: the shim's session, or its command line."""
    found = []
    for pid in cluster.pids_with_tag(tag):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            session = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
        except (OSError, ValueError, IndexError):
            continue
        if pid == shim_pid or session == shim_pid or SHIM_MARKER in cmdline:
            found.append(pid)
    return found


class TestDynamoFollowerSidecar(TinyModelTestCase):
    @classmethod
    def setUpClass(cls):
        if not _consumer_installed():
            raise AssertionError(
                f"{DYNAMO} is not importable; install the released consumer with "
                "`python scripts/dynamo_env.py --python <this environment's python>`"
            )
        super().setUpClass()

    @contextlib.contextmanager
    def group(
        self, *, legacy: bool, grpc_endpoint: bool
    ) -> Iterator[tuple[EngineGroup, cluster.Node, cluster.Node]]:
        """An attention-DP leader and a follower running the released consumer."""
        group = EngineGroup(self.model, 2, ATTENTION_DP)
        sidecar_args = [
            "--sidecar-on-followers",
            "--sidecar-shutdown-timeout", "10",
            *TRANSPORT_ARGS,
            "--namespace", f"overlay-{uuid.uuid4().hex[:12]}",
        ]  # fmt: skip
        if grpc_endpoint:
            sidecar_args += ["--grpc-endpoint", f"http://{group.address(1)}:{group.grpc_ports[1]}"]
        env = dynamo.consumer_environ(self.workdir, legacy=legacy)
        with (
            mock.patch.dict(os.environ, env, clear=True),
            cluster.nodes(group.for_node(0), group.for_node(1, DYNAMO, sidecar_args)) as started,
        ):
            leader, follower = started
            yield group, leader, follower

    def log_line(self, node: cluster.Node, text: str, unless: str | None = None) -> str:
        """The first line of the node's log containing ``text``; fails at once on ``unless``."""

        def find() -> str | None:
            log = node.log_path.read_text(errors="replace")
            found = next((line for line in log.splitlines() if text in line), None)
            if found is None and unless is not None and unless in log:
                raise AssertionError(f"{unless!r} before {text!r}:\n{node.log_tail(80)}")
            return found

        return cluster.wait_for(find, CONSUMER_DEADLINE, f"{text!r} in {node.name}'s log")

    def shim_pid(self, group: EngineGroup, follower: cluster.Node) -> int:
        """The consumer's shim, from the overlay's start line, started on the node's endpoint."""
        line = self.log_line(follower, f"follower sidecar {DYNAMO} started pid=")
        self.assertIn(f"endpoint=http://{group.address(1)}:{group.grpc_ports[1]} ", line)
        return int(re.search(r"started pid=(\d+)", line).group(1))

    def assert_waits_for_leader(self, group: EngineGroup, follower: cluster.Node) -> None:
        line = self.log_line(follower, WAITING_FOR_LEADER, unless=CONSUMER_EXITED)
        self.assertIn("node_rank=1", line)
        # The group the consumer derived from the follower's own GetServerInfo.
        self.assertIn(f'group="dist_init:tcp://{group.dist_init_addr}"', line)
        info = follower.server_info()
        self.assertEqual(info["node_rank"], 1)
        self.assertEqual(info["dp_size"], 2)
        self.assertEqual(info["kv_event_rank_space"]["size"], 2)
        self.assertEqual([s["dp_rank"] for s in info["kv_event_sources"]], [1])
        sys.stderr.write(f"[{RELEASE}] {line}\n")

    def assert_consumer_ends_with_its_follower(
        self, group: EngineGroup, follower: cluster.Node
    ) -> None:
        """SIGKILL the follower's engine process: no consumer process outlives it."""
        shim = self.shim_pid(group, follower)
        running = consumer_pids(follower.tag, shim)
        # The shim and the provider it forked.
        self.assertGreaterEqual(len(running), 2, running)
        self.assertNotIn(CONSUMER_SIGTERM, follower.log_path.read_text(errors="replace"))
        killed_at = time.monotonic()
        os.kill(follower.proc.pid, signal.SIGKILL)
        follower.proc.wait(timeout=STOP_DEADLINE)
        cluster.wait_for(
            lambda: consumer_pids(follower.tag, shim) == [],
            GONE_DEADLINE,
            f"the consumer's processes {running} to exit",
        )
        gone_after = time.monotonic() - killed_at
        self.assertEqual(follower.proc.returncode, -signal.SIGKILL)
        # It was told to stop (the shim's SIGTERM to its tree), not cut off mid-run.
        log = follower.log_path.read_text(errors="replace")
        self.assertIn(CONSUMER_SIGTERM, log)
        self.assertLess(log.index(WAITING_FOR_LEADER), log.index(CONSUMER_SIGTERM))
        sys.stderr.write(f"[{RELEASE}] consumer gone {gone_after:.2f} s after SIGKILL\n")

    # --- scenarios -----------------------------------------------------------------------------

    def test_switch_on_waits_for_leader_and_ends_with_its_follower(self):
        with self.group(legacy=True, grpc_endpoint=True) as (group, leader, follower):
            for node in (leader, follower):
                node.expect_ready()
            self.assert_waits_for_leader(group, follower)
            self.assert_consumer_ends_with_its_follower(group, follower)

    def test_switch_off_rejected_on_0_5_22_plus_else_waits(self):
        with self.group(legacy=False, grpc_endpoint=False) as (group, leader, follower):
            if not ATTENTION_DP_REPORTS_DP_SIZE_1:
                for node in (leader, follower):
                    node.expect_ready()
                self.assert_waits_for_leader(group, follower)
                self.assert_consumer_ends_with_its_follower(group, follower)
                return
            # The rejection brings the follower down, possibly before its ready event.
            self.shim_pid(group, follower)
            line = self.log_line(follower, RANK_OUTSIDE_DP_SIZE, unless=WAITING_FOR_LEADER)
            follower.proc.wait(timeout=STOP_DEADLINE)
            self.assertNotEqual(follower.proc.returncode, 0)
            log = follower.log_path.read_text(errors="replace")
            self.assertIn(f"{CONSUMER_EXITED} with code 1", log)
            self.assertIn("triggering SIGQUIT", log)
            self.assertNotIn(WAITING_FOR_LEADER, log)
            sys.stderr.write(f"[{RELEASE}] switch off: {line}\n")


if __name__ == "__main__":
    unittest.main()
