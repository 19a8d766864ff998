"""Test-side helpers: node processes, free ports, a tiny model directory, gRPC probes.

Each node runs ``overlay_harness.node`` in its own session, so a test can always take down a
node with everything it spawned (``killpg``), even when the test fails half-way.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from sglang_sidecar_overlay.tools.probe import wire as _grpc_wire

HARNESS_ROOT = Path(__file__).resolve().parent.parent
TAG_ENV = "SGLANG_OVERLAY_TEST_NODE_TAG"
# Importing SGLang takes tens of seconds on a loaded 2-core machine, once per process.
NODE_READY_DEADLINE = 420.0
SERVING, NOT_SERVING = 1, 2

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


def _ports_below_ephemeral() -> range:
    """Ports the kernel never hands out to outgoing connections.

    A port picked from the ephemeral range can be taken by any client socket (a gRPC probe,
    a ZMQ connect) between the check here and the node's bind; below it, only another
    explicit bind can.
    """
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        if low > 12000:
            return range(10000, low)
    return range(10000, 30000)


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


class EngineGroup:
    """Launch arguments of one engine group (``--nnodes`` nodes on loopback), per node."""

    def __init__(self, model: Path, nnodes: int, parallel: list[str]):
        self.model = model
        self.nnodes = nnodes
        self.parallel = parallel
        # With attention DP, SGLang derives its TCP IPC ports from ``--dist-init-addr``:
        # the next seven ports after it.
        self.dist_port = free_port_range(8)
        # Rank r of SGLang's ZmqEventPublisher binds base + r for its PUB and its replay ROUTER.
        self.kv_base = free_port_range(4)
        self.replay_base = free_port_range(4)
        self.grpc_ports = [free_port() for _ in range(nnodes)]
        self.http_ports = [free_port() for _ in range(nnodes)]

    @property
    def dist_init_addr(self) -> str:
        return f"127.0.0.1:{self.dist_port}"

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
            "--host", "127.0.0.1",
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


class Node:
    """One node process; ``ready()`` returns its ready event or raises with its log."""

    # The module run as the node: ``overlay_harness.node`` or a provider's variant.
    module = "overlay_harness.node"

    def __init__(self, args: list[str], log_dir: Path, name: str):
        self.tag = uuid.uuid4().hex
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        env = dict(os.environ)
        env[TAG_ENV] = self.tag
        env["PYTHONPATH"] = str(HARNESS_ROOT)
        env["SGLANG_PLUGINS"] = plugin_allow_list()
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            cwd=HARNESS_ROOT,
            start_new_session=True,
        )
        self.event: dict | None = None

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

    def wait_past_port_checks(self, timeout: float = NODE_READY_DEADLINE) -> None:
        """Until the node has spawned a child process or exited.

        ``Engine._launch_subprocesses`` spawns nothing before ``PortArgs.init_new`` (its only
        port availability checks) has returned.
        """
        wait_for(
            lambda: len(pids_with_tag(self.tag)) > 1 or self.proc.poll() is not None,
            timeout,
            f"{self.name} to start its first child process",
        )

    def stop(self, timeout: float = 30.0) -> int | None:
        """Close stdin (orderly stop), then kill the node's whole session.

        An orderly stop takes 2-5 s here. On 0.5.23 a leader's stop has been seen to hang in
        the native gRPC server's ``shutdown()`` while one of its threads waits to run
        ``RuntimeHandle.get_server_info``; the kill after ``timeout`` bounds what that costs.
        """
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
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


def node_rank_of(args: list[str]) -> int:
    return int(args[args.index("--node-rank") + 1]) if "--node-rank" in args else 0


def start_followers_first(start: Callable[[list[str], int], Node], arg_lists: list[list[str]]):
    """Start every follower and let it pass its port checks, then the leader; returns all nodes.

    One host plays every node here. With attention DP, SGLang derives the leader's TCP IPC
    ports from ``--dist-init-addr`` and every node's ``PortArgs.init_new`` waits for them to be
    free; the leader's real tokenizer manager and detokenizer then bind them. On a cluster they
    are bound on another host; here a follower must pass that check before the leader binds.
    It cannot wait for the follower's ready event: an attention-DP follower's DP controller
    only gets ready after the leader's has sent it the worker ports.
    """
    order = sorted(range(len(arg_lists)), key=lambda i: node_rank_of(arg_lists[i]) == 0)
    started: dict[int, Node] = {}
    try:
        for index in order:
            started[index] = start(arg_lists[index], index)
            if node_rank_of(arg_lists[index]) != 0:
                started[index].wait_past_port_checks()
    except BaseException:
        for node in started.values():
            node.stop()
        raise
    return [started[index] for index in range(len(arg_lists))]


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
    """Start the nodes (followers first, see ``start_followers_first``); always stop them."""
    with tempfile.TemporaryDirectory(prefix="overlay-nodes-") as log_dir:
        started: list[Node] = []
        try:
            started = start_followers_first(
                lambda args, index: Node(args, Path(log_dir), f"node{index}"), list(arg_lists)
            )
            yield started
        except BaseException:
            for node in started:
                sys.stderr.write(f"--- {node.name} log (tail) ---\n{node.log_tail(80)}\n")
            raise
        finally:
            for node in started:
                node.stop()


# --- gRPC probes -------------------------------------------------------------------------------


def _raw(channel: grpc.Channel, path: str) -> Any:
    return channel.unary_unary(
        path, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )


def get_server_info(port: int, host: str = "127.0.0.1") -> dict:
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        reply = _raw(channel, _grpc_wire.GET_SERVER_INFO_PATH)(
            _grpc_wire.encode_get_server_info_request(), timeout=30.0
        )
    return json.loads(_grpc_wire.decode_get_server_info_response(reply))


def health(port: int, host: str = "127.0.0.1") -> int | None:
    """grpc.health.v1 status of the whole server, None when nothing answers."""
    status = health_or_error(port, host)
    return status if isinstance(status, int) else None


def health_or_error(port: int, host: str = "127.0.0.1") -> int | grpc.StatusCode:
    """grpc.health.v1 status of the whole server, or the gRPC error code of the Check."""
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            reply = _raw(channel, _grpc_wire.HEALTH_CHECK_PATH)(
                _grpc_wire.encode_health_check_request(""), timeout=5.0
            )
        except grpc.RpcError as exc:
            return exc.code()
    return _grpc_wire.decode_health_check_response(reply)


class HealthWatch:
    """A grpc.health.v1 Watch stream, so a NOT_SERVING sent just before close is not missed."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self._channel = grpc.insecure_channel(f"{host}:{port}")
        watch = self._channel.unary_stream(
            _grpc_wire.HEALTH_WATCH_PATH,
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        self._stream = watch(_grpc_wire.encode_health_check_request(""), timeout=120.0)
        self._seen: list[int] = []

    def first_status(self) -> int:
        """The status the server sends when the watch starts (the stream is open from then)."""
        if not self._seen:
            self._seen.append(_grpc_wire.decode_health_check_response(next(self._stream)))
        return self._seen[0]

    def statuses_until(self, wanted: int) -> list[int]:
        """Every status sent since the watch started, up to the first ``wanted``."""
        seen = list(self._seen)
        if seen and seen[-1] == wanted:
            return seen
        for reply in self._stream:
            seen.append(_grpc_wire.decode_health_check_response(reply))
            if seen[-1] == wanted:
                return seen
        return seen

    def close(self) -> None:
        self._stream.cancel()
        self._channel.close()
