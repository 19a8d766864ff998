"""One engine group's launch plan: per node, its host, ports, arguments and environment.

Every node runs SGLang's real scheduler on the CPU: the config-only tiny model shipped in
``models/`` (``--load-format dummy``: no weights), the test platform from ``cpu_platform/``
(``SGLANG_PLATFORM``), the torch-native attention backend, schedulers that sleep when idle
(``--sleep-on-idle``: two cores are shared by every process of a test), and a page size above
1 so the advertised ``block_size`` is checked against what the events carry. A multi-node group gets
one host per node (``overlay_harness.netns``) with ``--dist-init-addr`` on the leader's
address, so the nodes' real gloo rendezvous crosses the test's bridge.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from overlay_harness import netns, ports

MODELS = Path(__file__).resolve().parent / "models"
TINY_MODEL = MODELS / "tiny-qwen3"
LOOPBACK = "127.0.0.1"
PAGE_SIZE = 16
KV_TOPIC = "kv"
# The test platform's entry-point name (test-registered/cpu_platform).
PLATFORM = "overlay_cpu"
# SGLang's scheduler binds its OpenMP threads to one entry per local device index; a node
# here runs at most four ranks on a 2-core machine.
OMP_THREADS_BIND = "0|1|0|1"
# What a real-scheduler launch on this machine needs besides the topology.
CPU_ARGS = (
    "--load-format", "dummy",
    "--skip-tokenizer-init",
    "--device", "cpu",
    "--dtype", "float32",
    "--attention-backend", "torch_native",
    "--disable-cuda-graph",
    "--disable-custom-all-reduce",
    # SGLang sizes the KV pool from the drop in the host's available memory while weights
    # load; other nodes and sessions starting meanwhile take memory too, and with a small
    # fraction that drop fails the launch ("Loaded weights leave no GPU memory for the KV
    # cache"). The pool is capped by --max-total-tokens either way.
    "--mem-fraction-static", "0.8",
    "--max-total-tokens", "4096",
    "--page-size", str(PAGE_SIZE),
    # Idle schedulers poll their sockets without blocking otherwise, a core each.
    "--sleep-on-idle",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Launch:
    """What one node is started with: its group and rank, SGLang arguments and environment."""

    group: EngineGroup
    node_rank: int
    args: list[str]
    environ: dict[str, str]
    grpc_port: int | None

    @property
    def host(self) -> netns.Host | None:
        return self.group.host(self.node_rank)

    @property
    def address(self) -> str:
        return self.group.address(self.node_rank)

    @property
    def http_port(self) -> int:
        return self.group.http_ports[self.node_rank]


class EngineGroup:
    """Launch plans of one engine group: one node on the test's own host (loopback), or
    ``nnodes`` hosts on a private bridge (one namespace each).

    ``network`` puts the group's nodes on hosts ``first_host``, ``first_host + 1``, ... of a
    network shared with other groups (a prefill and a decode engine, each its own host)."""

    def __init__(
        self,
        nnodes: int,
        parallel: list[str],
        model: Path = TINY_MODEL,
        network: netns.Network | None = None,
        first_host: int = 0,
    ):
        self.model = model
        self.nnodes = nnodes
        self.parallel = parallel
        if network is None and nnodes > 1:
            network = netns.Network(nnodes)
        self.network = network
        self.first_host = first_host
        # With attention DP, SGLang derives its TCP IPC ports from ``--dist-init-addr``:
        # the next seven ports after it.
        self.dist_port = ports.free_port_range(8)
        # Rank r of SGLang's ZmqEventPublisher binds base + r for its PUB and its replay ROUTER.
        self.kv_base = ports.free_port_range(4)
        self.replay_base = ports.free_port_range(4)
        self.grpc_ports = [ports.free_port() for _ in range(nnodes)]
        self.http_ports = [ports.free_port() for _ in range(nnodes)]

    def host(self, node_rank: int) -> netns.Host | None:
        """The namespace node ``node_rank`` runs in; None on the test's own host."""
        if self.network is None:
            return None
        return self.network.hosts[self.first_host + node_rank]

    def address(self, node_rank: int) -> str:
        """The address node ``node_rank`` serves on (``--host``)."""
        host = self.host(node_rank)
        return host.address if host is not None else LOOPBACK

    def grpc_endpoint(self, node_rank: int) -> str:
        """The URL of node ``node_rank``'s gRPC server, as its sidecar is told it."""
        return f"http://{self.address(node_rank)}:{self.grpc_ports[node_rank]}"

    @property
    def dist_init_addr(self) -> str:
        return f"{self.address(0)}:{self.dist_port}"

    def kv_events_config(self) -> str:
        return json.dumps(
            {
                "publisher": "zmq",
                "endpoint": f"tcp://*:{self.kv_base}",
                "replay_endpoint": f"tcp://*:{self.replay_base}",
                "topic": KV_TOPIC,
            }
        )

    def launch(
        self,
        node_rank: int,
        *,
        sidecar: str | None = None,
        sidecar_args: list[str] | None = None,
        grpc: bool = True,
        kv_events: str | None = None,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> Launch:
        """Node ``node_rank``'s launch: ``sidecar`` with its ``sidecar_args``, no
        ``--grpc-port`` unless ``grpc``, ``kv_events`` in place of the group's config,
        ``extra`` arguments last, and ``env`` in this node's environment only."""
        grpc_port = self.grpc_ports[node_rank] if grpc else None
        args = [
            "--model-path", str(self.model),
            *CPU_ARGS,
            "--host", self.address(node_rank),
            "--port", str(self.http_ports[node_rank]),
            "--kv-events-config", kv_events or self.kv_events_config(),
            *self.parallel,
        ]  # fmt: skip
        if self.nnodes > 1:
            # A single node picks its own rendezvous ports, as a single-node launch does.
            args += ["--nnodes", str(self.nnodes), "--node-rank", str(node_rank),
                     "--dist-init-addr", self.dist_init_addr]  # fmt: skip
        if grpc_port is not None:
            args += ["--grpc-port", str(grpc_port)]
        if sidecar is not None:
            args += ["--sidecar", sidecar, "--sidecar-args", json.dumps(sidecar_args or [])]
        args += extra or []
        environ = {**self.node_environ(node_rank), **(env or {})}
        return Launch(self, node_rank, args, environ, grpc_port)

    def node_environ(self, node_rank: int) -> dict[str, str]:
        """What the node's host provides: the CPU platform, and the address and interface its
        process groups use (an operator sets the same two on a real cluster)."""
        host = self.host(node_rank)
        return {
            "SGLANG_PLATFORM": PLATFORM,
            "SGLANG_CPU_OMP_THREADS_BIND": OMP_THREADS_BIND,
            "SGLANG_HOST_IP": self.address(node_rank),
            "GLOO_SOCKET_IFNAME": netns.NODE_INTERFACE if host is not None else "lo",
        }
