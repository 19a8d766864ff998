"""The seeds' four deployments at the seed's full shapes, launched as users launch them: every
node its own host (``overlay_harness.netns``), SGLang's real schedulers on the CPU test
platform, Dynamo 1.6.1's released sidecar on every node (serving on leaders, relaying on
followers, in the engine's disaggregation mode on PD engines), Dynamo's OpenAI frontend (KV
router mode) in front and its standalone router(s) beside it as the oracle of what the events
told a router. Disaggregated engines move real KV pages (``overlay_harness.pd``).

One launcher per deployment, each entering what it starts into the caller's exit stack:
``make validate`` (``overlay_harness.validation``) runs all four in each column, and the
deployment tests that take the seed's shape launch theirs here. Where the nodes do not load
the plugin (the stock column, the rebuilt wheel), each sidecar is given its endpoint in
``--grpc-endpoint``, as an operator does (``docs/dynamo.md``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from overlay_harness import checks, dynamo, netns, nodes, pd, ports
from overlay_harness.group import PAGE_SIZE, EngineGroup

ORDINARY_DP = ["--tp", "1", "--dp", "2"]
ATTENTION_DP = ["--tp", "2", "--dp", "2", "--enable-dp-attention"]
STOP_TIMEOUT = 10.0


@dataclasses.dataclass
class Deployment:
    """A launched deployment: its nodes, Dynamo's frontend and the oracle router(s), the
    (worker, DP rank) targets it should have, and, disaggregated, its prefill and decode nodes
    (the prefill engines' leaders serve ``/metrics``)."""

    nodes: list[nodes.Node]
    launch: str
    frontend: dynamo.Frontend
    router: dynamo.Router | dynamo.PrefillDecodeRouters
    targets: int
    prefill: list[nodes.Node] = dataclasses.field(default_factory=list)
    decode: list[nodes.Node] = dataclasses.field(default_factory=list)
    metered: list[nodes.Node] = dataclasses.field(default_factory=list)

    @property
    def disaggregated(self) -> bool:
        return bool(self.prefill)


def sidecar(group: EngineGroup, node_rank: int, mode: str | None = None) -> dict:
    """``launch`` keywords for Dynamo's sidecar on node ``node_rank`` of ``group``: without
    the plugin, its endpoint in ``--grpc-endpoint``, as an operator passes it."""
    return {
        "sidecar": dynamo.DYNAMO,
        "sidecar_args": dynamo.sidecar_args(
            follower=node_rank > 0, endpoint=group.grpc_endpoint(node_rank), mode=mode,
            explicit_endpoint=not nodes.plugin_loaded(),
        ),
    }  # fmt: skip


def start(stack: contextlib.ExitStack, workdir: Path, launches: list, names: list[str],
          topology: str) -> tuple[list[nodes.Node], str]:  # fmt: skip
    """The nodes of ``launches``, started in order, each ready, stopped when ``stack`` closes;
    (nodes, the time to every node ready and the memory then: ``checks.report_launch``)."""
    began = time.monotonic()
    started = stack.enter_context(
        nodes.running(*launches, names=names, log_dir=workdir, stop_timeout=STOP_TIMEOUT)
    )
    for node in started:
        node.expect_ready()
    return started, checks.report_launch(topology, started, began)


def frontend_on(stack: contextlib.ExitStack, node: nodes.Node, workdir: Path) -> dynamo.Frontend:
    frontend = dynamo.Frontend(node.host, node.address, workdir / "home", workdir / "frontend.log")
    stack.callback(frontend.stop)
    return frontend


def ordinary_dp_aggregate(stack: contextlib.ExitStack, workdir: Path) -> Deployment:
    """1: two TP 1 / DP 2 engines, one per node."""
    tokenizer_args = dynamo.enter_consumer(stack, workdir)
    network = netns.Network(2)
    groups = [EngineGroup(1, ORDINARY_DP, network=network, first_host=i) for i in range(2)]
    launches = [group.launch(0, **sidecar(group, 0), extra=[*dynamo.LEADER_ARGS, *tokenizer_args])
                for group in groups]  # fmt: skip
    started, launched = start(
        stack,
        workdir,
        launches,
        ["engine-a", "engine-b"],
        "two engines, TP 1 / DP 2 each, Dynamo sidecars",
    )
    router = dynamo.Router(started[0].host, PAGE_SIZE, workdir / "router.log")
    stack.callback(router.stop)
    return Deployment(started, launched, frontend_on(stack, started[0], workdir), router, 4)


def attention_dp_aggregate(stack: contextlib.ExitStack, workdir: Path) -> Deployment:
    """2: one TP 2 / attention-DP 2 engine across two nodes."""
    tokenizer_args = dynamo.enter_consumer(stack, workdir)
    group = EngineGroup(2, ATTENTION_DP)
    # The follower first: it waits for its leader in the rendezvous, as in production.
    launches = [group.launch(1, **sidecar(group, 1), extra=tokenizer_args),
                group.launch(0, **sidecar(group, 0),
                             extra=[*dynamo.LEADER_ARGS, *tokenizer_args])]  # fmt: skip
    (follower, leader), launched = start(
        stack,
        workdir,
        launches,
        ["follower", "leader"],
        "two nodes, TP 2 / attention DP 2, Dynamo sidecars",
    )
    router = dynamo.Router(leader.host, PAGE_SIZE, workdir / "router.log")
    stack.callback(router.stop)
    frontend = frontend_on(stack, leader, workdir)
    return Deployment([leader, follower], launched, frontend, router, 2)


def disaggregated(stack: contextlib.ExitStack, workdir: Path, *, engines: int,
                  nnodes: int, parallel: list[str]) -> Deployment:  # fmt: skip
    """``engines`` prefill and as many decode engines of ``nnodes`` nodes each, every node its
    own host, moving real KV pages (``overlay_harness.pd``); the oracle routers start before
    the workers register (``docs/dynamo.md``, "Disaggregated workers")."""
    tokenizer_args = dynamo.enter_consumer(stack, workdir)
    network = netns.Network(2 * engines * nnodes)
    network.acquire()
    stack.callback(network.release)
    groups = [EngineGroup(nnodes, parallel, network=network, first_host=i * nnodes)
              for i in range(2 * engines)]  # fmt: skip
    prefill_groups, decode_groups = groups[:engines], groups[engines:]
    routers = dynamo.PrefillDecodeRouters(decode_groups[0].host(0), PAGE_SIZE, workdir)
    stack.callback(routers.stop)
    metrics = ["--enable-metrics"] if nnodes == 1 else []
    launches, names = [], []
    for kind, kind_groups in (("prefill", prefill_groups), ("decode", decode_groups)):
        for index, group in enumerate(kind_groups):
            extra = [*pd.TRANSFER_ARGS, *metrics, *tokenizer_args]
            if kind == "prefill":
                bootstrap = ["--disaggregation-bootstrap-port", str(ports.free_port())]
                extra += [*pd.PREFILL_ARGS, *bootstrap]
            else:
                extra += pd.DECODE_ARGS
            for node_rank in reversed(range(nnodes)):  # followers first
                leader_args = dynamo.LEADER_ARGS if node_rank == 0 else []
                launches.append(group.launch(node_rank, **sidecar(group, node_rank, kind),
                                             extra=[*extra, *leader_args]))  # fmt: skip
                names.append(f"{kind}{index}-node{node_rank}")
    topology = (f"{engines} prefill and {engines} decode engine(s) of {nnodes} node(s), "
                f"{' '.join(parallel)}, Dynamo sidecars")  # fmt: skip
    started, launched = start(stack, workdir, launches, names, topology)
    half = len(started) // 2
    prefill, decode = started[:half], started[half:]
    # The frontend beside the routers, on the first decode engine's leader.
    decode_leader = next(node for node in decode if node.node_rank == 0)
    return Deployment(
        started, launched, frontend_on(stack, decode_leader, workdir), routers, 4 * engines,
        prefill=prefill, decode=decode,
        metered=[node for node in prefill if node.node_rank == 0] if metrics else [],
    )  # fmt: skip


def ordinary_dp_disaggregate(stack: contextlib.ExitStack, workdir: Path) -> Deployment:
    """3: two TP 1 / DP 2 prefill engines and two decode engines, one per node."""
    return disaggregated(stack, workdir, engines=2, nnodes=1, parallel=["--dp-size", "2"])


def attention_dp_disaggregate(stack: contextlib.ExitStack, workdir: Path) -> Deployment:
    """4: a TP 2 / attention-DP 2 prefill engine and a decode engine, two nodes each."""
    return disaggregated(stack, workdir, engines=1, nnodes=2, parallel=ATTENTION_DP)


Launcher = Callable[[contextlib.ExitStack, Path], Deployment]
SHAPES: dict[int, tuple[str, Launcher]] = {
    1: ("ordinary DP aggregate: two TP1/DP2 engines, 2 nodes", ordinary_dp_aggregate),
    2: ("attention DP aggregate: one TP2/attention-DP2 engine, 2 nodes", attention_dp_aggregate),
    3: ("ordinary DP disaggregate: two TP1/DP2 prefill and two decode engines, 4 nodes",
        ordinary_dp_disaggregate),
    4: ("attention DP disaggregate: TP2/attention-DP2 prefill and decode, 4 nodes",
        attention_dp_disaggregate),
}  # fmt: skip
