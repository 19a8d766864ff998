"""Test-side helpers: node processes, free ports, a tiny model directory.

Each node runs ``overlay_harness.node`` in its own session, so a test can always take down a
node with everything it spawned (``killpg``), even when the test fails half-way. Every node of
a multi-node group is its own host (``overlay_harness.netns``): its own network namespace and
address on a private bridge, ``--dist-init-addr`` on the leader's address, so nodes start in
any order and a node's loopback endpoints are reachable only from inside it. A test therefore
asks a node through the node (``node.server_info()``, ``node.inside(probes.X, ...)``): in
the node's namespace, or in the test process for a single-node group on the test's own host.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from overlay_harness import netns, probes

HARNESS_ROOT = Path(__file__).resolve().parent.parent
TAG_ENV = "SGLANG_OVERLAY_TEST_NODE_TAG"
# Importing SGLang takes tens of seconds on a loaded 2-core machine, once per process.
NODE_READY_DEADLINE = 420.0
SERVING, NOT_SERVING = probes.SERVING, probes.NOT_SERVING
LOOPBACK = "127.0.0.1"

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "vocab_size": 256,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


def write_tiny_model(directory: Path) -> Path:
    """A model directory with only a config: no weights are ever read here."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    return directory


# Set by ``scripts/sglang_envs.py test --jobs N`` for sessions run side by side: "<index>/<count>".
PORT_SHARE_ENV = "SGLANG_OVERLAY_TEST_PORT_SHARE"


def _ports_below_ephemeral() -> range:
    """Ports the kernel never hands out to outgoing connections, this session's share of them.

    A port picked from the ephemeral range can be taken by any client socket (a gRPC probe,
    a ZMQ connect) between the check here and the node's bind; below it, only another
    explicit bind can. Test sessions run side by side take disjoint shares, so two of them
    never hand out the same port.
    """
    ports = range(10000, 30000)
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        if low > 12000:
            ports = range(10000, low)
    return _session_share(ports, os.environ.get(PORT_SHARE_ENV))


def _session_share(ports: range, share: str | None) -> range:
    if not share:
        return ports
    try:
        index, count = (int(part) for part in share.split("/"))
        if not 0 <= index < count:
            raise ValueError
    except ValueError:
        raise ValueError(f"{PORT_SHARE_ENV}={share!r}: expected <index>/<count>") from None
    width = len(ports) // count
    return range(ports.start + index * width, ports.start + (index + 1) * width)


# Its own generator: SGLang seeds the global one. Ports handed out stay taken for this process,
# so two picks can never return the same port before either is bound.
_port_random = random.SystemRandom()
_handed_out: set[int] = set()


def free_port_range(width: int) -> int:
    """A base port whose next ``width`` ports are free right now, below the ephemeral range."""
    ports = _ports_below_ephemeral()
    for _ in range(200):
        base = _port_random.randrange(ports.start, ports.stop - width)
        if _handed_out.intersection(range(base, base + width)):
            continue
        socks = []
        try:
            for offset in range(width):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", base + offset))
            _handed_out.update(range(base, base + width))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {width} consecutive free ports in {ports}")


def free_port() -> int:
    return free_port_range(1)


# Groups by their ``--dist-init-addr`` port (unique per process): a node finds its host there.
_groups: weakref.WeakValueDictionary[int, EngineGroup] = weakref.WeakValueDictionary()


class EngineGroup:
    """Launch arguments of one engine group, per node: one node on the test's own host
    (loopback), or ``--nnodes`` hosts on a private bridge (one namespace each)."""

    def __init__(self, model: Path, nnodes: int, parallel: list[str]):
        self.model = model
        self.nnodes = nnodes
        self.parallel = parallel
        self.network = netns.Network(nnodes) if nnodes > 1 else None
        # With attention DP, SGLang derives its TCP IPC ports from ``--dist-init-addr``:
        # the next seven ports after it.
        self.dist_port = free_port_range(8)
        _groups[self.dist_port] = self
        # Rank r of SGLang's ZmqEventPublisher binds base + r for its PUB and its replay ROUTER.
        self.kv_base = free_port_range(4)
        self.replay_base = free_port_range(4)
        self.grpc_ports = [free_port() for _ in range(nnodes)]
        self.http_ports = [free_port() for _ in range(nnodes)]

    def host(self, node_rank: int) -> netns.Host | None:
        """The namespace node ``node_rank`` runs in; None on the test's own host."""
        return self.network.hosts[node_rank] if self.network is not None else None

    def address(self, node_rank: int) -> str:
        """The address node ``node_rank`` serves on (``--host``)."""
        host = self.host(node_rank)
        return host.address if host is not None else LOOPBACK

    @property
    def dist_init_addr(self) -> str:
        return f"{self.address(0)}:{self.dist_port}"

    def for_node(
        self, node_rank: int, sidecar: str | None = None, sidecar_args: list[str] | None = None
    ) -> list[str]:
        kv_events = json.dumps(
            {
                "publisher": "zmq",
                "endpoint": f"tcp://*:{self.kv_base}",
                "replay_endpoint": f"tcp://*:{self.replay_base}",
                "topic": "kv",
            }
        )
        args = [
            "--model-path", str(self.model),
            "--skip-tokenizer-init",
            "--skip-server-warmup",
            "--device", "cpu",
            "--host", self.address(node_rank),
            "--port", str(self.http_ports[node_rank]),
            "--grpc-port", str(self.grpc_ports[node_rank]),
            "--nnodes", str(self.nnodes),
            "--node-rank", str(node_rank),
            "--dist-init-addr", self.dist_init_addr,
            "--kv-events-config", kv_events,
            *self.parallel,
        ]  # fmt: skip
        if sidecar is not None:
            args += ["--sidecar", sidecar, "--sidecar-args", json.dumps(sidecar_args or [])]
        return args


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
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def plugin_allow_list() -> str:
    """SGLang's ``SGLANG_PLUGINS`` for processes under test: only this plugin, or none of them
    against the rebuilt wheel (``sglang_envs.py test --patched`` sets the override)."""
    return os.environ.get("SGLANG_OVERLAY_TEST_PLUGINS", "sidecar_overlay")


def option(args: list[str], flag: str) -> str | None:
    """The value given to ``flag`` in launch arguments, None when absent."""
    return args[args.index(flag) + 1] if flag in args else None


def node_rank_of(args: list[str]) -> int:
    return int(option(args, "--node-rank") or 0)


def _network_and_host(args: list[str]) -> tuple[netns.Network | None, netns.Host | None]:
    """The network and host of the group these launch arguments belong to (by the
    ``--dist-init-addr`` port), whatever the test added to or removed from them."""
    dist_init_addr = option(args, "--dist-init-addr")
    group = _groups.get(int(dist_init_addr.rsplit(":", 1)[1])) if dist_init_addr else None
    if group is None or group.network is None:
        return None, None
    return group.network, group.host(node_rank_of(args))


def harness_environ() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(HARNESS_ROOT))


def run_inside(host: netns.Host | None, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` (a module-level function with JSON arguments and result) run in
    ``host``'s namespace through ``overlay_harness.inside``; in this process when ``host`` is
    None. An exception inside is raised here as an ``AssertionError`` naming the host."""
    if host is None:
        return function(*args)
    proc = subprocess.run(
        host.command(_inside_argv(function, args)),
        capture_output=True,
        text=True,
        timeout=300,
        env=harness_environ(),
        cwd=HARNESS_ROOT,
    )
    lines = proc.stdout.splitlines()
    record = json.loads(lines[-1]) if lines else {}
    if "result" not in record:
        raise AssertionError(
            f"{function.__name__}{args} inside {host}: "
            f"{record.get('raised') or proc.stderr[-2000:]}"
        )
    return record["result"]


def _inside_argv(function: Callable[..., Any], args: tuple) -> list[str]:
    module = function.__module__
    return [sys.executable, "-m", "overlay_harness.inside", module, function.__name__,
            json.dumps(list(args))]  # fmt: skip


class InsideStream:
    """A generator function from ``overlay_harness.probes`` running in ``host``'s namespace
    (in a subprocess on the test's own host too), its items read as they come."""

    def __init__(self, host: netns.Host | None, function: Callable[..., Any], *args: Any):
        argv = _inside_argv(function, args)
        self.proc = subprocess.Popen(
            host.command(argv) if host is not None else argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=harness_environ(),
            cwd=HARNESS_ROOT,
        )
        self.what = f"{function.__name__}{args} in {host or 'this host'}"

    def next_item(self, timeout: float = 120.0) -> Any:
        """The next item; raises when the stream ends or nothing comes within ``timeout``."""
        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not selector.select(timeout):
                raise AssertionError(f"{self.what}: nothing within {timeout:.0f} s")
        finally:
            selector.close()
        line = self.proc.stdout.readline()
        record = json.loads(line) if line else {}
        if "item" not in record:
            raise AssertionError(f"{self.what} ended: {record or self.proc.stderr.read()[-2000:]}")
        return record["item"]

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.proc.stderr.close()


class HealthWatch:
    """A grpc.health.v1 Watch stream, so a NOT_SERVING sent just before close is not missed."""

    def __init__(self, node: Node):
        self._stream = InsideStream(node.host, probes.watch_health, node.grpc_port, node.address)
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
    """One node process; ``ready()`` returns its ready event or raises with its log.

    A node of a multi-node group runs in its host's namespace (``ip netns exec`` execs, so
    ``proc.pid`` is the node itself); the network is held from here until ``stop()``.
    """

    # The module run as the node: ``overlay_harness.node`` or a provider's variant.
    module = "overlay_harness.node"

    def __init__(self, args: list[str], log_dir: Path, name: str):
        self.network, self.host = _network_and_host(args)
        self.address = self.host.address if self.host is not None else LOOPBACK
        grpc_port = option(args, "--grpc-port")
        self.grpc_port = int(grpc_port) if grpc_port else None
        self.tag = uuid.uuid4().hex
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        env = harness_environ()
        env[TAG_ENV] = self.tag
        env["SGLANG_PLUGINS"] = plugin_allow_list()
        if self.network is not None:
            self.network.acquire()
        try:
            self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
            self.proc = subprocess.Popen(
                self.command([sys.executable, "-m", self.module, *args]),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                env=env,
                cwd=HARNESS_ROOT,
                start_new_session=True,
            )
        except BaseException:
            self._release_network()
            raise
        self.event: dict | None = None

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
        return run_inside(self.host, function, *args)

    def server_info(self) -> dict:
        """The node's native gRPC ``GetServerInfo``."""
        return self.inside(probes.get_server_info, self.grpc_port, self.address)

    def health(self) -> int | None:
        return self.inside(probes.health, self.grpc_port, self.address)

    def health_or_error(self) -> int | str:
        return self.inside(probes.health_or_error, self.grpc_port, self.address)

    def watch_health(self) -> HealthWatch:
        return HealthWatch(self)

    def log_tail(self, lines: int = 60) -> str:
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace")
            return "\n".join(line[:400] for line in text.splitlines()[-lines:])
        return ""

    def ready(self, timeout: float = NODE_READY_DEADLINE) -> dict:
        """The node's first event (``ready`` or ``error``)."""
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
        """The ready event; otherwise fail with the node's error event and its log."""
        event = self.ready(timeout)
        if event.get("event") != "ready":
            raise AssertionError(f"{self.name} did not get ready: {event}\n{self.log_tail(200)}")
        return event

    def wait_gone(self, timeout: float = 60.0) -> float:
        """Seconds until no process of the node is left (its tag gone from every process);
        raises past ``timeout``. A node's schedulers are reaped before it fails, but
        multiprocessing's resource tracker may take a moment to notice its parent is gone."""
        start = time.monotonic()
        wait_for(
            lambda: pids_with_tag(self.tag) == [], timeout, f"no process of {self.name} to be left"
        )
        return time.monotonic() - start

    def request_stop(self) -> None:
        """Ask for an orderly stop (close stdin) without waiting for it."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()

    def stop(self, timeout: float = 30.0) -> int | None:
        """Close stdin (orderly stop), then kill the node's whole session.

        An orderly stop takes 2-5 s here. On 0.5.23 a leader's stop has been seen to hang in
        the native gRPC server's ``shutdown()`` while one of its threads waits to run
        ``RuntimeHandle.get_server_info``; the kill after ``timeout`` bounds what that costs.
        """
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


class HttpLeader(Node):
    """A leader through SGLang's real ``http_server.launch_server``
    (``overlay_harness.providers.http_node``): uvicorn, the FastAPI lifespan, HTTP
    ``/server_info``; same session, tag and log handling as a ``Node``."""

    module = "overlay_harness.providers.http_node"

    def terminate(self, timeout: float = 90.0) -> int:
        """SIGTERM to the server process only, as an orchestrator's stop sends it."""
        os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


def stop_all(nodes: list[Node], timeout: float = 30.0) -> None:
    """Stop ``nodes`` together: each is asked to stop before any is waited on, so their
    orderly stops overlap instead of adding up."""
    for node in nodes:
        node.request_stop()
    for node in nodes:
        node.stop(timeout)


def start_nodes(start: Callable[[list[str], int], Node], arg_lists: list[list[str]]):
    """Start the nodes in the order given (each node is its own host, so any order works);
    if one fails to start, stop the ones already started. Returns them in that order."""
    started: list[Node] = []
    try:
        for index, args in enumerate(arg_lists):
            started.append(start(args, index))
    except BaseException:
        stop_all(started)
        raise
    return started


@contextlib.contextmanager
def holding_port(group: EngineGroup, node_rank: int, port: int) -> Iterator[None]:
    """``port`` on node ``node_rank``'s address taken (bound, listening) by another process on
    that node's host, before the node starts."""
    network = group.network
    if network is not None:
        network.acquire()
    try:
        holder = InsideStream(
            group.host(node_rank), probes.hold_port, group.address(node_rank), port
        )
        try:
            holder.next_item(timeout=60)
            yield
        finally:
            holder.close()
    finally:
        if network is not None:
            network.release()


@contextlib.contextmanager
def running(node: Node, stop_timeout: float = 5.0) -> Iterator[Node]:
    """The started ``node``; its log tail printed if the body fails; always stopped."""
    try:
        yield node
    except BaseException:
        sys.stderr.write(f"--- {node.name} log (tail) ---\n{node.log_tail(80)}\n")
        raise
    finally:
        node.stop(timeout=stop_timeout)


@contextlib.contextmanager
def nodes(*arg_lists: list[str]) -> Iterator[list[Node]]:
    """Start the nodes in the order given (``start_nodes``); always stop them."""
    with tempfile.TemporaryDirectory(prefix="overlay-nodes-") as log_dir:
        started: list[Node] = []
        try:
            started = start_nodes(
                lambda args, index: Node(args, Path(log_dir), f"node{index}"), list(arg_lists)
            )
            yield started
        except BaseException:
            for node in started:
                sys.stderr.write(f"--- {node.name} log (tail) ---\n{node.log_tail(80)}\n")
            raise
        finally:
            stop_all(started)
