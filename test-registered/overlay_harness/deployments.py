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

A launcher's ``consumer`` puts another Dynamo version in front (``dynamo.consumer``): a next
version lives in an env of its own, so SGLang cannot start it as ``--sidecar``. Its sidecars
are started beside the ready nodes, one per node with ``--grpc-endpoint``, and its frontend
and routers run from its env.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from overlay_harness import checks, differences, dynamo, netns, nodes, pd, ports
from overlay_harness.group import PAGE_SIZE, EngineGroup

ORDINARY_DP = ["--tp", "1", "--dp", "2"]
ATTENTION_DP = ["--tp", "2", "--dp", "2", "--enable-dp-attention"]
STOP_TIMEOUT = 10.0
BLOCKING_FOLLOWER = "blocking-follower"  # node_process's role for launch_server's follower


@dataclasses.dataclass
class Deployment:
    """A launched deployment: its nodes, Dynamo's frontend and the oracle router(s), the
    (worker, DP rank) targets it should have, and, disaggregated, its prefill and decode nodes
    (the prefill engines' leaders serve ``/metrics``), and how to start its nodes again."""

    nodes: list[nodes.Node]
    launch: str
    frontend: dynamo.Frontend
    router: dynamo.Router | dynamo.PrefillDecodeRouters
    targets: int
    prefill: list[nodes.Node] = dataclasses.field(default_factory=list)
    decode: list[nodes.Node] = dataclasses.field(default_factory=list)
    metered: list[nodes.Node] = dataclasses.field(default_factory=list)
    start_again: Callable[[list[nodes.Node]], list[nodes.Node]] | None = None

    @property
    def disaggregated(self) -> bool:
        return bool(self.prefill)

    def relaunch(self, old: list[nodes.Node]) -> list[nodes.Node]:
        """``old``'s nodes (whose processes are gone) started again from their launches, as an
        orchestrator relaunches them: same hosts and ports, each ready, stopped with the rest
        of the deployment; they take the old ones' places in every list here."""
        if self.start_again is None:
            raise RuntimeError(f"deployment {self.launch!r} cannot start its nodes again")
        new = self.start_again(old)
        replaced = dict(zip((id(node) for node in old), new, strict=True))
        for nodes_list in (self.nodes, self.prefill, self.decode, self.metered):
            nodes_list[:] = [replaced.get(id(node), node) for node in nodes_list]
        return new


@dataclasses.dataclass(frozen=True)
class Resilience:
    """What an operator sets for faults (``docs/operator-guide.md``): every sidecar's restart
    policy, and the frontend's ``--migration-limit`` (0: off, Dynamo's default)."""

    sidecar_restart: str = "never"
    migration_limit: int = 0


DEFAULTS = Resilience()


@dataclasses.dataclass
class Placed:
    """Where one node's sidecar goes: the node's group and rank, and its engine's
    disaggregation mode."""

    group: EngineGroup
    node_rank: int
    mode: str | None = None


def restart_policy_supported() -> bool:
    """Whether the nodes' ``--sidecar`` takes ``--sidecar-restart``: the plugin's supervisor
    and the series' do; stock SGLang passes unknown options on to the provider, and never
    restarts it."""
    return nodes.plugin_loaded() or differences.on_rebuilt_wheel()


def sidecar(placed: Placed, consumer: dynamo.Consumer, resilience: Resilience = DEFAULTS) -> dict:
    """``launch`` keywords for Dynamo's sidecar on ``placed``'s node, under ``resilience``'s
    restart policy: without the plugin, its endpoint in ``--grpc-endpoint``, as an operator
    passes it; none when ``consumer``'s sidecars are started beside the nodes."""
    if not consumer.supervised:
        return {}
    group, node_rank, mode = placed.group, placed.node_rank, placed.mode
    restart = []
    if resilience.sidecar_restart != DEFAULTS.sidecar_restart and restart_policy_supported():
        restart = ["--sidecar-restart", resilience.sidecar_restart]
    return {
        "sidecar": dynamo.DYNAMO,
        "sidecar_args": restart + dynamo.sidecar_args(
            follower=node_rank > 0, endpoint=group.grpc_endpoint(node_rank), mode=mode,
            explicit_endpoint=not nodes.plugin_loaded(),
        ),
    }  # fmt: skip


def start(stack: contextlib.ExitStack, workdir: Path, launches: list, names: list[str],
          topology: str, roles: list[str | None] | None = None,
          ) -> tuple[list[nodes.Node], str]:  # fmt: skip
    """The nodes of ``launches``, started in order (in ``roles``, ``node_process``'s, when
    given), each ready (a blocking follower: serving), stopped when ``stack`` closes; (nodes,
    the time to every node ready and the memory then: ``checks.report_launch``)."""
    began = time.monotonic()
    started = stack.enter_context(
        nodes.running(*launches, names=names, roles=roles, log_dir=workdir,
                      stop_timeout=STOP_TIMEOUT)
    )  # fmt: skip
    for node in started:
        if node.role == BLOCKING_FOLLOWER:
            node.wait_serving()
        else:
            node.expect_ready()
    return started, checks.report_launch(topology, started, began)


def starting_again(stack: contextlib.ExitStack, workdir: Path,
                   topology: str) -> Callable[[list[nodes.Node]], list[nodes.Node]]:  # fmt: skip
    """A deployment's ``start_again``: nodes started again from their launches, names and
    roles (their networks stay held by the old nodes until ``stack`` closes)."""

    def start_again(old: list[nodes.Node]) -> list[nodes.Node]:
        started, _ = start(stack, workdir, [node.launch for node in old],
                           [node.name for node in old], topology,
                           roles=[node.role for node in old])  # fmt: skip
        return started

    return start_again


def start_beside(
    stack: contextlib.ExitStack,
    workdir: Path,
    consumer: dynamo.Consumer,
    placements: list[Placed],
    names: list[str],
) -> None:
    """``consumer``'s sidecar for every node of ``placements`` (named ``names``), when they
    are not the nodes' own ``--sidecar``; stopped when ``stack`` closes."""
    if consumer.supervised:
        return
    for placed, name in zip(placements, names, strict=True):
        endpoint = placed.group.grpc_endpoint(placed.node_rank)
        log_path = workdir / f"sidecar-{consumer.version}-{name}.log"
        process = dynamo.external_sidecar(
            consumer, placed.group.host(placed.node_rank), endpoint, placed.mode, log_path
        )
        stack.callback(process.stop)


def frontend_on(
    stack: contextlib.ExitStack,
    node: nodes.Node,
    workdir: Path,
    consumer: dynamo.Consumer,
    resilience: Resilience = DEFAULTS,
) -> dynamo.Frontend:
    frontend = dynamo.Frontend(node.host, node.address, workdir / "home",
                               workdir / "frontend.log", consumer,
                               migration_limit=resilience.migration_limit)  # fmt: skip
    stack.callback(frontend.stop)
    return frontend


def router_on(
    stack: contextlib.ExitStack, node: nodes.Node, workdir: Path, consumer: dynamo.Consumer
) -> dynamo.Router:
    router = dynamo.Router(node.host, PAGE_SIZE, workdir / "router.log",
                           **consumer.process_options())  # fmt: skip
    stack.callback(router.stop)
    return router


def ordinary_dp_aggregate(
    stack: contextlib.ExitStack,
    workdir: Path,
    consumer: dynamo.Consumer = dynamo.RELEASED,
    resilience: Resilience = DEFAULTS,
) -> Deployment:
    """1: two TP 1 / DP 2 engines, one per node."""
    tokenizer_args = dynamo.enter_consumer(stack, workdir, consumer)
    network = netns.Network(2)
    groups = [EngineGroup(1, ORDINARY_DP, network=network, first_host=i) for i in range(2)]
    placements = [Placed(group, 0) for group in groups]
    names = ["engine-a", "engine-b"]
    launches = [placed.group.launch(0, **sidecar(placed, consumer, resilience),
                                    extra=[*dynamo.LEADER_ARGS, *tokenizer_args])
                for placed in placements]  # fmt: skip
    started, launched = start(
        stack, workdir, launches, names, "two engines, TP 1 / DP 2 each, Dynamo sidecars"
    )
    start_beside(stack, workdir, consumer, placements, names)
    router = router_on(stack, started[0], workdir, consumer)
    frontend = frontend_on(stack, started[0], workdir, consumer, resilience)
    return Deployment(started, launched, frontend, router, 4)


def attention_dp_aggregate(
    stack: contextlib.ExitStack,
    workdir: Path,
    consumer: dynamo.Consumer = dynamo.RELEASED,
    resilience: Resilience = DEFAULTS,
) -> Deployment:
    """2: one TP 2 / attention-DP 2 engine across two nodes."""
    tokenizer_args = dynamo.enter_consumer(stack, workdir, consumer)
    group = EngineGroup(2, ATTENTION_DP)
    # The follower first: it waits for its leader in the rendezvous, as in production.
    placements, names = [Placed(group, 1), Placed(group, 0)], ["follower", "leader"]
    launches = [group.launch(1, **sidecar(placements[0], consumer, resilience),
                             extra=tokenizer_args),
                group.launch(0, **sidecar(placements[1], consumer, resilience),
                             extra=[*dynamo.LEADER_ARGS, *tokenizer_args])]  # fmt: skip
    # The follower is launch_server itself, as in production: SGLang's blocking follower
    # branch, so how the node ends when a scheduler dies or SIGTERM comes is part of the rows.
    topology = "two nodes, TP 2 / attention DP 2, Dynamo sidecars"
    (follower, leader), launched = start(
        stack, workdir, launches, names, topology, roles=[BLOCKING_FOLLOWER, None],
    )  # fmt: skip
    start_beside(stack, workdir, consumer, placements, names)
    router = router_on(stack, leader, workdir, consumer)
    frontend = frontend_on(stack, leader, workdir, consumer, resilience)
    return Deployment([leader, follower], launched, frontend, router, 2,
                      start_again=starting_again(stack, workdir, topology))  # fmt: skip


def disaggregated(stack: contextlib.ExitStack, workdir: Path, consumer: dynamo.Consumer, *,
                  engines: int, nnodes: int, parallel: list[str],
                  resilience: Resilience = DEFAULTS) -> Deployment:  # fmt: skip
    """``engines`` prefill and as many decode engines of ``nnodes`` nodes each, every node its
    own host, moving real KV pages (``overlay_harness.pd``); the oracle routers start before
    the workers register (``docs/dynamo.md``, "Disaggregated workers")."""
    tokenizer_args = dynamo.enter_consumer(stack, workdir, consumer)
    network = netns.Network(2 * engines * nnodes)
    network.acquire()
    stack.callback(network.release)
    groups = [EngineGroup(nnodes, parallel, network=network, first_host=i * nnodes)
              for i in range(2 * engines)]  # fmt: skip
    prefill_groups, decode_groups = groups[:engines], groups[engines:]
    routers = dynamo.PrefillDecodeRouters(decode_groups[0].host(0), PAGE_SIZE, workdir, consumer)
    stack.callback(routers.stop)
    metrics = ["--enable-metrics"] if nnodes == 1 else []
    launches, names, placements = [], [], []
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
                placements.append(Placed(group, node_rank, kind))
                launches.append(group.launch(node_rank,
                                             **sidecar(placements[-1], consumer, resilience),
                                             extra=[*extra, *leader_args]))  # fmt: skip
                names.append(f"{kind}{index}-node{node_rank}")
    topology = (f"{engines} prefill and {engines} decode engine(s) of {nnodes} node(s), "
                f"{' '.join(parallel)}, Dynamo sidecars")  # fmt: skip
    started, launched = start(stack, workdir, launches, names, topology)
    start_beside(stack, workdir, consumer, placements, names)
    half = len(started) // 2
    prefill, decode = started[:half], started[half:]
    # The frontend beside the routers, on the first decode engine's leader.
    decode_leader = next(node for node in decode if node.node_rank == 0)
    return Deployment(
        started, launched, frontend_on(stack, decode_leader, workdir, consumer, resilience),
        routers, 4 * engines,
        prefill=prefill, decode=decode,
        metered=[node for node in prefill if node.node_rank == 0] if metrics else [],
        start_again=starting_again(stack, workdir, topology),
    )  # fmt: skip


def ordinary_dp_disaggregate(
    stack: contextlib.ExitStack,
    workdir: Path,
    consumer: dynamo.Consumer = dynamo.RELEASED,
    resilience: Resilience = DEFAULTS,
) -> Deployment:
    """3: two TP 1 / DP 2 prefill engines and two decode engines, one per node."""
    return disaggregated(stack, workdir, consumer, engines=2, nnodes=1,
                         parallel=["--dp-size", "2"], resilience=resilience)  # fmt: skip


def attention_dp_disaggregate(
    stack: contextlib.ExitStack,
    workdir: Path,
    consumer: dynamo.Consumer = dynamo.RELEASED,
    resilience: Resilience = DEFAULTS,
) -> Deployment:
    """4: a TP 2 / attention-DP 2 prefill engine and a decode engine, two nodes each."""
    return disaggregated(stack, workdir, consumer, engines=1, nnodes=2, parallel=ATTENTION_DP,
                         resilience=resilience)  # fmt: skip


Launcher = Callable[[contextlib.ExitStack, Path, dynamo.Consumer], Deployment]
SHAPES: dict[int, tuple[str, Launcher]] = {
    1: ("ordinary DP aggregate: two TP1/DP2 engines, 2 nodes", ordinary_dp_aggregate),
    2: ("attention DP aggregate: one TP2/attention-DP2 engine, 2 nodes", attention_dp_aggregate),
    3: ("ordinary DP disaggregate: two TP1/DP2 prefill and two decode engines, 4 nodes",
        ordinary_dp_disaggregate),
    4: ("attention DP disaggregate: TP2/attention-DP2 prefill and decode, 4 nodes",
        attention_dp_disaggregate),
}  # fmt: skip
