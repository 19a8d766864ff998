"""Node lifecycle on the test side: start a node process, ask it things, stop it.

Each node runs ``overlay_harness.node_process`` in its own process group, so a test can always
take down a node with everything it spawned (``killpg``, then every process carrying the node's
tag), even when the test fails half-way. Not in its own session: the kernel's autogroup
scheduling gives every session an equal share of the CPU, so a node's busy-polling DP
controller, lowered to ``nice 19`` (``node_process``), would still take a whole session's share
from the other nodes and tests; within one session the niceness holds. A node of a multi-node
group runs on its host (``netns.Host.node_command``) and everything that asks it runs there too
(``node.inside(probes.X, ...)``); a single-node group runs on the test's own host.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sglang_sidecar_overlay import entry_point
from sglang_sidecar_overlay.sidecar import proctree

from overlay_harness import inside, probes
from overlay_harness.group import EngineGroup, Launch

# SGLang's diagnostics on its crash path (SIGQUIT): a py-spy dump of the schedulers, then a
# 60 s wait for CUDA coredumps (0.5.22+). Nothing here has CUDA, and no test reads a dump:
# off on every node, so a node brought down on purpose is gone in seconds.
NO_CRASH_DIAGNOSTICS = {
    "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
}
TAG_ENV = "SGLANG_OVERLAY_TEST_NODE_TAG"
# Importing SGLang takes tens of seconds per process on a loaded 2-core machine, and a group's
# nodes import theirs at the same time.
NODE_READY_DEADLINE = 600.0
SERVING, NOT_SERVING = probes.SERVING, probes.NOT_SERVING
# What the nodes' SGLANG_PLUGINS is: only this plugin, or (against the rebuilt wheel, where
# ``scripts/sglang_envs.py test --patched`` sets the override) none.
PLUGINS_OVERRIDE_ENV = "SGLANG_OVERLAY_TEST_PLUGINS"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def pids_with_tag(tag: str) -> list[int]:
    """Live processes whose environment carries ``tag`` (a node and all it spawned)."""
    found = []
    needle = f"{TAG_ENV}={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        stat = proctree.read_stat(int(entry.name))
        if stat is not None and stat.state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def pids_of_tree(roots: list[int]) -> list[int]:
    """``roots`` and every live descendant: SGLang's subprocesses set their process titles,
    which overwrites the environment ``/proc`` shows, so their tag cannot be read there."""
    table = proctree.process_table()
    found = set(roots)
    for root in roots:
        found.update(pid for pid, _start in proctree.descendants(root, table))
    return sorted(found)


def plugin_allow_list() -> str:
    return os.environ.get(PLUGINS_OVERRIDE_ENV, entry_point.PLUGIN_NAME)


def plugin_loaded() -> bool:
    """Whether the nodes load this plugin (not on the stock side nor the rebuilt wheel)."""
    return entry_point.PLUGIN_NAME in plugin_allow_list().split(",")


class HealthWatch:
    """A grpc.health.v1 Watch stream, so a NOT_SERVING sent just before close is not missed."""

    def __init__(self, node: Node):
        self._stream = inside.Stream(node.host, probes.watch_health, node.grpc_port, node.address)
        self._seen: list[int] = []

    def first_status(self) -> int:
        """The status the server sends when the watch starts (the stream is open from then)."""
        if not self._seen:
            self._seen.append(self._stream.next_item())
        return self._seen[0]

    def statuses_until(self, wanted: int) -> list[int]:
        """Every status sent since the watch started, up to the first ``wanted`` (or the end)."""
        seen = self._seen
        while not seen or seen[-1] != wanted:
            try:
                seen.append(self._stream.next_item())
            except AssertionError:
                break
        return list(seen)

    def close(self) -> None:
        self._stream.close()


class Node:
    """One node process, started from its ``Launch``; ``ready()`` returns its first event.

    ``role`` is ``overlay_harness.node_process``'s: ``leader`` and ``follower`` by node rank,
    or ``blocking-follower`` (SGLang's blocking follower branch, no ready event). The node's
    network is held from here until ``stop()``.
    """

    def __init__(self, launch: Launch, log_dir: Path, name: str, role: str | None = None):
        self.launch = launch
        self.node_rank = launch.node_rank
        self.host = launch.host
        self.address = launch.address
        self.grpc_port = launch.grpc_port
        self.http_port = launch.http_port
        self.role = role or ("leader" if launch.node_rank == 0 else "follower")
        self.tag = uuid.uuid4().hex
        self.name = name
        self.log_path = log_dir / f"{name}-{self.tag[:8]}.log"
        self.event: dict | None = None
        env = inside.harness_environ()
        env.update(NO_CRASH_DIAGNOSTICS)
        # A launch's own environment may restrict the plugins further (a stock node).
        env[entry_point.SGLANG_PLUGINS_ENV] = plugin_allow_list()
        env.update(launch.environ)
        env[TAG_ENV] = self.tag
        argv = [sys.executable, "-m", "overlay_harness.node_process", self.role, *launch.args]
        self.network = launch.group.network
        if self.network is not None:
            self.network.acquire()
        try:
            self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
            self.proc = subprocess.Popen(
                self.host.node_command(argv) if self.host is not None else argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                env=env,
                cwd=inside.HARNESS_ROOT,
                process_group=0,
            )
        except BaseException:
            self._release_network()
            raise

    def _release_network(self) -> None:
        network, self.network = self.network, None
        if network is not None:
            network.release()

    # --- asking the node, from where it is ---------------------------------------------------

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run on this node's host."""
        return self.host.command(argv) if self.host is not None else argv

    def inside(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` (from ``overlay_harness.probes``) run on this node's host."""
        return inside.run(self.host, function, *args)

    def stream(self, function: Callable[..., Any], *args: Any) -> inside.Stream:
        """A generator function from ``overlay_harness.probes`` running on this node's host."""
        return inside.Stream(self.host, function, *args)

    def server_info(self) -> dict:
        """The node's native gRPC ``GetServerInfo``."""
        return self.inside(probes.get_server_info, self.grpc_port, self.address)

    def health(self) -> int | None:
        return self.inside(probes.health, self.grpc_port, self.address)

    def health_or_error(self) -> int | str:
        return self.inside(probes.health_or_error, self.grpc_port, self.address)

    def watch_health(self) -> HealthWatch:
        return HealthWatch(self)

    def generate(
        self, input_ids: list[int], max_new_tokens: int, dp_rank: int | None, seconds: float = 120
    ) -> dict:
        """A real ``POST /generate`` on the leader's HTTP port (``routed_dp_rank`` pinned when
        ``dp_rank`` is given); the reply's ``meta_info``."""
        return self.inside(
            probes.generate,
            self.http_port,
            self.address,
            input_ids,
            max_new_tokens,
            dp_rank,
            seconds,
        )

    def log_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(line[:400] for line in self.log_text().splitlines()[-lines:])

    def ready(self, timeout: float = NODE_READY_DEADLINE) -> dict:
        """The node's first event (``ready``, ``error`` or ``exited``)."""
        if self.event is not None:
            return self.event
        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not selector.select(timeout):
                raise AssertionError(
                    f"{self.name}: no ready event within {timeout:.0f} s\n{self.log_tail()}"
                )
        finally:
            selector.close()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise AssertionError(
                f"{self.name} exited {self.proc.returncode} without an event\n{self.log_tail()}"
            )
        self.event = json.loads(line)
        return self.event

    def expect_ready(self, timeout: float = NODE_READY_DEADLINE) -> dict:
        """The ready event; otherwise fail with the node's event and its log."""
        event = self.ready(timeout)
        if event.get("event") != "ready":
            raise AssertionError(f"{self.name} did not get ready: {event}\n{self.log_tail(200)}")
        return event

    def wait_serving(self, timeout: float = NODE_READY_DEADLINE) -> dict:
        """A node without a ready event (``blocking-follower``): its ``GetServerInfo`` once it
        answers; fails with the node's log if the node exits first."""

        def answered() -> dict | None:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited {self.proc.returncode}\n{self.log_tail(200)}"
                )
            with contextlib.suppress(AssertionError):
                return self.server_info()
            return None

        return wait_for(answered, timeout, f"{self.name}'s metadata server to answer")

    def pids(self) -> list[int]:
        """Every live process of the node: those carrying its tag, and the members of its
        process group (SGLang's titled processes, a scheduler or the DP controller, overwrite
        the environment the tag is in: ``setproctitle``)."""
        table = proctree.process_table()
        members = {pid for pid, _start in proctree.group_members(self.proc.pid, table)}
        return sorted(members | set(pids_with_tag(self.tag)))

    def wait_gone(self, timeout: float = 60.0) -> float:
        """Seconds until no process of the node is left (its tag gone from every process);
        raises past ``timeout``."""
        start = time.monotonic()
        wait_for(
            lambda: pids_with_tag(self.tag) == [], timeout, f"no process of {self.name} to be left"
        )
        return time.monotonic() - start

    def request_stop(self) -> None:
        """Ask for an orderly stop (close stdin) without waiting for it."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()

    def terminate(self, timeout: float = 90.0) -> int:
        """SIGTERM to the node process only, as an orchestrator's stop sends it."""
        os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 30.0) -> int | None:
        """Close stdin (orderly stop), then kill the node's whole process group and every
        process that carries its tag."""
        self.request_stop()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids_with_tag(self.tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        self._log.close()
        self._release_network()
        return self.proc.returncode


def stop_all(nodes: list[Node], timeout: float = 30.0) -> None:
    """Stop ``nodes`` together: each is asked to stop before any is waited on, so their
    orderly stops overlap instead of adding up."""
    for node in nodes:
        node.request_stop()
    for node in nodes:
        node.stop(timeout)


def start_nodes(launches: list[Launch], log_dir: Path, names: list[str] | None = None,
                roles: list[str | None] | None = None) -> list[Node]:  # fmt: skip
    """Start the nodes in the order given (each node is its own host, so any order works);
    if one fails to start, stop the ones already started."""
    names = names or [f"node{launch.node_rank}" for launch in launches]
    roles = roles or [None] * len(launches)
    started: list[Node] = []
    try:
        for launch, name, role in zip(launches, names, roles, strict=True):
            started.append(Node(launch, log_dir, name, role))
    except BaseException:
        stop_all(started)
        raise
    return started


def print_logs(nodes: list[Node], lines: int = 80) -> None:
    for node in nodes:
        sys.stderr.write(f"--- {node.name} log (tail) ---\n{node.log_tail(lines)}\n")


@contextlib.contextmanager
def running(*launches: Launch, names: list[str] | None = None,
            roles: list[str | None] | None = None, stop_timeout: float = 30.0,
            log_dir: Path | None = None) -> Iterator[list[Node]]:  # fmt: skip
    """The nodes of ``launches`` started in order; their log tails printed if the body fails;
    always stopped together."""
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="overlay-")))
        started: list[Node] = []
        try:
            started = start_nodes(list(launches), log_dir, names, roles)
            yield started
        except BaseException:
            print_logs(started)
            raise
        finally:
            stop_all(started, stop_timeout)


@contextlib.contextmanager
def holding_port(group: EngineGroup, node_rank: int, port: int) -> Iterator[None]:
    """``port`` on node ``node_rank``'s address taken (bound, listening) by another process on
    that node's host, before the node starts."""
    network = group.network
    if network is not None:
        network.acquire()
    try:
        with inside.Stream(
            group.host(node_rank), probes.hold_port, group.address(node_rank), port
        ) as holder:
            holder.next_item(timeout=60)
            yield
    finally:
        if network is not None:
            network.release()
