"""The fault table's rows: one fault injected into a launched deployment while a steady load
(``overlay_harness.load``) flows through Dynamo's frontend, and the row's measures.

Each row function takes a launched ``deployments.Deployment`` and returns a :class:`Cell`:
the load's counts (sent, served, failed, hung past the bound, the first error), the recovery
times the row defines, the processes of the failed part left after its bound, and notes. A
cell's ``problems`` are where it misses the row's goal for the overlay (``docs/faults.md``);
``make faults`` (``overlay_harness.fault_table``) writes the cells of every column, and the
tests that run a row in ``make test`` assert that there are none.

Every wait has a deadline; the load ends (each request within its bound) whatever happens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

from sglang_sidecar_overlay.sidecar import proctree

from overlay_harness import dynamo, kv_events, load, nodes, seed_checks
from overlay_harness.deployments import Deployment

# Requests served before the fault: the load is warm, every client has been answered.
WARM_REQUESTS = 4
WARM_DEADLINE = 180.0
# Requests served after the recovery checks, so the window shows the load flowing again.
AFTER_REQUESTS = 4
AFTER_DEADLINE = 180.0
# The goals (issue: the fault table): a relay back within 5 s, an engine back in the
# router's view within 10 s, a failed group gone within 10 s.
RELAY_BACK = 5.0
ENGINE_BACK = 10.0
GROUP_GONE = 10.0
# How long a restarted part gets before the row records it as not back.
RECOVERY_DEADLINE = 120.0
# One pinned prompt's events get this long to be scored before the next prompt is tried.
SCORE_ATTEMPT = 5.0
SIDECAR_MARKER = f"sglang-sidecar:{dynamo.DYNAMO}".encode()


@dataclasses.dataclass
class Cell:
    """One row in one column."""

    row: str
    column: str
    fault: str
    sent: int = 0
    succeeded: int = 0
    failed: int = 0
    hung: int = 0
    first_error: str | None = None
    recovery: dict[str, float | None] = dataclasses.field(default_factory=dict)
    left: int | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    def take(self, measured: load.Measured) -> None:
        """Add a load's counts (a row may run one load before its fault, one after)."""
        self.sent += measured.sent
        self.succeeded += measured.succeeded
        self.failed += len(measured.failed)
        self.hung += measured.hung
        self.first_error = self.first_error or measured.first_error

    def expect(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def summary(self) -> str:
        recovery = ", ".join(
            f"{name} {seconds_or_never(value)}" for name, value in self.recovery.items()
        )
        return (f"{self.row} ({self.column}): {self.sent} sent, {self.succeeded} served, "
                f"{self.failed} failed, {self.hung} hung; {recovery}; left {self.left}; "
                f"first error: {self.first_error}; notes: {self.notes}; "
                f"problems: {self.problems}")  # fmt: skip


def seconds_or_never(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


# --- the processes of a node ------------------------------------------------------------------


def _cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""


def node_pids(node: nodes.Node) -> list[int]:
    """Every live process of ``node`` (``Node.pids``; a Slurm step's node counts its own)."""
    return node.pids()


def _parent(pid: int) -> int | None:
    stat = proctree.read_stat(pid)
    return stat.ppid if stat is not None else None


def sidecar_pids(node: nodes.Node) -> list[int]:
    """Live processes of the node's Dynamo sidecar (the supervisor's shim and its provider)."""
    return [pid for pid in node_pids(node) if SIDECAR_MARKER in _cmdline(pid)]


# Stock SGLang's --sidecar: a multiprocessing child running the provider's main, logged so.
STOCK_SIDECAR_STARTED = re.compile(rf"Sidecar module {re.escape(dynamo.DYNAMO)} started pid=(\d+)")


def provider_pid(node: nodes.Node) -> int | None:
    """The node's running sidecar provider, where the consumer's code runs: the supervisor
    shim's child (the overlay, the series), or the child stock SGLang logged it started."""
    pids = sidecar_pids(node)
    supervised = next((pid for pid in pids if _parent(pid) in pids), None)
    if supervised is not None:
        return supervised
    logged = [int(pid) for pid in STOCK_SIDECAR_STARTED.findall(node.log_text())]
    return logged[-1] if logged and logged[-1] in node_pids(node) else None


def kill_provider(node: nodes.Node) -> tuple[float, int]:
    """SIGKILL the node's sidecar provider, as a crash would end it; (when, its pid)."""
    pid = nodes.wait_for(lambda: provider_pid(node), RECOVERY_DEADLINE, f"{node.name}'s sidecar")
    os.kill(pid, signal.SIGKILL)
    return time.monotonic(), pid


def provider_back(node: nodes.Node, old: int, since: float) -> float | None:
    """Seconds from ``since`` until a new provider runs on ``node``; None past the deadline,
    or at once when the node itself has exited (nothing will restart the sidecar)."""

    def settled() -> str | None:
        if provider_pid(node) not in (None, old):
            return "back"
        return "node gone" if node.proc.poll() is not None else None

    with contextlib.suppress(AssertionError):
        if nodes.wait_for(settled, RECOVERY_DEADLINE, "") == "back":
            return time.monotonic() - since
    return None


# --- what the router scores ------------------------------------------------------------------


def scored_again(deployment: Deployment, target: seed_checks.Target,
                 since: float) -> float | None:  # fmt: skip
    """Seconds from ``since`` until a new prompt pinned to ``target`` is scored there (and
    nowhere else) by the oracle router; a prompt whose events never come is followed by a new
    one. None past the deadline."""
    frontend, router = deployment.frontend, deployment.router

    def attempt() -> bool:
        prompt = kv_events.prompt(seed_checks.INPUT_TOKENS)
        (reply,) = frontend.generate_many([prompt], 1, 1, dynamo.pin(target))
        if "error" in reply:
            return False
        targets = list(router.target_scores(prompt))
        return seed_checks.events_seen(router, prompt, (target,), targets, SCORE_ATTEMPT) is None

    with contextlib.suppress(AssertionError):
        nodes.wait_for(attempt, RECOVERY_DEADLINE, "")
        return time.monotonic() - since
    return None


def routed_again(deployment: Deployment, target: seed_checks.Target) -> seed_checks.Targeted:
    """The targeted requests of ``target`` alone (two pinned, seven unpinned repeats that must
    find its cache there), after a recovery."""
    pins = seed_checks.aggregated_pins([target])
    return seed_checks.targeted(deployment.frontend, deployment.router, pins, _targets(deployment))


# --- rows ------------------------------------------------------------------------------------


@contextlib.contextmanager
def loaded(deployment: Deployment, cell: Cell, *, serves_after: bool = True):
    """The steady load from warm until the block's checks are done and (where the deployment
    ``serves_after`` the fault) a few more requests were served; its counts go into ``cell``
    however the block ends."""
    deployment.frontend.wait_for_model()
    flow = load.Load(deployment.frontend)
    try:
        flow.wait_served(WARM_REQUESTS, WARM_DEADLINE)
        yield flow
        if serves_after:
            with contextlib.suppress(AssertionError):  # a load that stopped serving is counted
                flow.wait_served(AFTER_REQUESTS, AFTER_DEADLINE, since=time.monotonic())
    finally:
        cell.take(flow.finish())


def follower_relay_killed(deployment: Deployment, column: str, *, restarts: bool) -> Cell:
    """Rows a and b (deployment 2): the follower's relay sidecar SIGKILLed under load. With
    ``restarts`` (``--sidecar-restart on-failure``) it must be back within ``RELAY_BACK``
    seconds and rank 1's new blocks routed again, with no request failed; without, the node
    and its group go down within ``GROUP_GONE`` seconds, every request ending."""
    follower = deployment.nodes[1]
    cell = Cell("a" if restarts else "b", column, "follower relay SIGKILLed")
    targets = seed_checks.registered_targets(deployment.router, deployment.targets)
    rank1 = next(target for target in targets if target[1] == 1)
    with loaded(deployment, cell, serves_after=restarts) as flow:
        fault_at, old = kill_provider(follower)
        if restarts:
            back = cell.recovery["relay back"] = provider_back(follower, old, fault_at)
            scored = cell.recovery["rank 1 scored"] = scored_again(deployment, rank1, fault_at)
            again = routed_again(deployment, rank1)
            cell.notes.append(f"after the restart, rank 1 targeted {again.passed}/"
                              f"{again.requests}")  # fmt: skip
            cell.expect(
                back is not None and back <= RELAY_BACK, f"relay back {seconds_or_never(back)}"
            )
            cell.expect(scored is not None, "rank 1's new blocks never scored")
            cell.expect(again.passed == again.requests, f"rank 1 targeted: {again.failures[:3]}")
        else:
            flow.stop_sending()  # the group goes: the requests in flight are the row's
            gone = cell.recovery["group gone"] = gone_within(deployment.nodes, fault_at)
            cell.left = sum(len(node_pids(node)) for node in deployment.nodes)
            cell.expect(
                gone is not None and gone <= GROUP_GONE, f"group gone {seconds_or_never(gone)}"
            )
    if restarts:
        cell.expect(cell.failed == 0, f"{cell.failed} failed: {cell.first_error}")
    cell.expect(cell.hung == 0, f"{cell.hung} hung")
    return cell


def gone_within(group: list[nodes.Node], since: float,
                seconds: float = RECOVERY_DEADLINE) -> float | None:  # fmt: skip
    """Seconds from ``since`` until no process of ``group`` is left; None past ``seconds``."""
    with contextlib.suppress(AssertionError):
        nodes.wait_for(lambda: not any(node_pids(n) for n in group), seconds, "")
        return time.monotonic() - since
    return None


def serving_sidecar_killed(deployment: Deployment, column: str) -> Cell:
    """Row c (deployment 1, the frontend migrating): the first engine's serving sidecar
    SIGKILLed under load, restarted by ``--sidecar-restart on-failure``: no request fails,
    the engine is back in the router's view within ``ENGINE_BACK`` seconds, with its ranks
    scored, and serves again; the other engine serves on."""
    engine = deployment.nodes[0]
    cell = Cell("c", column, "serving sidecar SIGKILLed (migration on)")
    before = seed_checks.registered_targets(deployment.router, deployment.targets)
    with loaded(deployment, cell) as flow:
        fault_at, old = kill_provider(engine)
        cell.recovery["sidecar back"] = provider_back(engine, old, fault_at)
        back, fresh = new_worker(deployment, engine, before, fault_at)
        cell.recovery["engine back in the router"] = back
        if fresh is not None:
            cell.recovery["rank 0 scored"] = scored_again(deployment, (fresh, 0), fault_at)
    others = {worker for worker, _ in before} - node_workers(engine)
    cell.notes.append(f"the engine's worker {sorted(node_workers(engine) - {fresh})}, then {fresh}")
    cell.notes.append(f"{migrations(deployment)} requests migrated (the frontend's log)")
    measured = flow.measured()
    cell.recovery["served by the engine"] = measured.first_served_after(fault_at, {fresh})
    cell.recovery["served by the other engine"] = measured.first_served_after(fault_at, others)
    cell.expect(back is not None and back <= ENGINE_BACK, f"engine back {seconds_or_never(back)}")
    cell.expect(cell.recovery.get("rank 0 scored") is not None, "its ranks never scored again")
    cell.expect(cell.failed == 0, f"{cell.failed} failed: {cell.first_error}")
    cell.expect(cell.hung == 0, f"{cell.hung} hung")
    return cell


MIGRATION = "migration retry scheduled"  # what Dynamo's frontend logs per migrated request


def migrations(deployment: Deployment) -> int:
    return deployment.frontend.log_text().count(MIGRATION)


def _targets(deployment: Deployment) -> list[seed_checks.Target]:
    with contextlib.suppress(AssertionError):
        return list(deployment.router.target_scores(kv_events.prompt()))
    return []


def new_worker(deployment: Deployment, engine: nodes.Node, before: list,
               since: float) -> tuple[float | None, int | None]:  # fmt: skip
    """(seconds from ``since``, the worker id) once the router scores every rank of a worker
    it did not score ``before`` (a restarted sidecar registers anew); (None, None) past the
    deadline, or once ``engine`` has exited."""
    known = {worker for worker, _rank in before}
    ranks = len(before) // len(known)

    def fresh() -> int | str | None:
        found = [t for t in _targets(deployment) if t[0] not in known]
        if len(found) == ranks:
            return found[0][0]
        return "engine gone" if engine.proc.poll() is not None else None

    with contextlib.suppress(AssertionError):
        worker = nodes.wait_for(fresh, RECOVERY_DEADLINE, "")
        if isinstance(worker, int):
            return time.monotonic() - since, worker
    return None, None


# SIGTERM to SIGKILL, as an orchestrator's stop gives it (Kubernetes' default grace period).
GRACE = 30.0
# How a node ends on SIGTERM (docs/faults.md): 0 once SGLang's drain completes and uvicorn
# stops; SIGTERM's default action (a follower, after its sidecar and server stopped); SIGKILL
# from SGLang's own crash path (``kill_process_tree``, parent included) when a node's
# collective peers left mid-step. The harness's SIGKILL comes only after the grace period,
# which the row counts as a miss by itself.
STOP_EXIT_CODES = {0, -signal.SIGTERM, -signal.SIGKILL}


def terminate_each(group: list[nodes.Node]) -> None:
    """SIGTERM to every node process, as an orchestrator's stop sends it."""
    for node in group:
        os.kill(node.proc.pid, signal.SIGTERM)


def stop_as_orchestrator(group: list[nodes.Node], grace: float = GRACE, *,
                         stop: Callable[[list[nodes.Node]], object] = terminate_each,
                         signalled: Callable[[], None] = lambda: None,
                         ) -> tuple[float | None, int]:  # fmt: skip
    """``stop`` (SIGTERM to every node of ``group``; ``scancel`` under Slurm), then
    ``signalled()``, SIGKILL to what is left after ``grace`` seconds, as an orchestrator stops
    a group; (seconds until no process of the group was left, None past ``grace``; the
    processes left then). Returns once every node process is reaped."""
    began = time.monotonic()
    stop(group)
    signalled()
    gone = gone_within(group, began, grace)
    left = sum(len(node_pids(node)) for node in group)
    for node in group:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.proc.pid, signal.SIGKILL)
        for pid in node_pids(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for node in group:
        node.proc.wait(timeout=30)
    return gone, left


def group_stopped(deployment: Deployment, column: str, grace: float = GRACE,
                  stop: Callable[[list[nodes.Node]], object] = terminate_each,
                  fault: str = "SIGTERM to every node") -> Cell:  # fmt: skip
    """Row f: ``stop`` (SIGTERM to every node of the deployment; ``scancel`` under Slurm) with
    requests in flight, SIGKILL to what is left after ``grace`` seconds: every process gone
    within the grace period, each node's sidecar told (SIGTERM) and gone before its server
    stopped, every request ended."""
    cell = Cell("f", column, f"{fault}, SIGKILL after {grace:.0f} s")
    with loaded(deployment, cell, serves_after=False) as flow:
        # The group goes: the requests in flight are the row's.
        gone, cell.left = stop_as_orchestrator(deployment.nodes, grace, stop=stop,
                                               signalled=flow.stop_sending)  # fmt: skip
        cell.recovery["every process gone"] = gone
    codes = {node.name: node.proc.returncode for node in deployment.nodes}
    cell.notes.append(f"exit codes {codes}")
    for node in deployment.nodes:
        order = stop_order(node)
        cell.notes.append(f"{node.name}: {order}")
        cell.expect(order == STOPPED_FIRST, f"{node.name}: {order}")
        if column == "overlay" and node.node_rank > 0:
            # The follower's own SIGTERM, not only its leader's drain, stops its server first
            # (0.5.23 installs a SIGTERM handler after the server started).
            chained = FOLLOWER_SIGTERM_CHAINED in node.log_text()
            cell.expect(chained, f"{node.name}: its SIGTERM did not stop its server first")
    cell.expect(gone is not None, f"processes left after {grace:.0f} s: {cell.left}")
    cell.expect(set(codes.values()) <= STOP_EXIT_CODES, f"exit codes {codes}")
    cell.expect(cell.hung == 0, f"{cell.hung} hung")
    return cell


# Where a node's log says its sidecar was told to stop (the supervisor's SIGTERM), was stopped,
# and its server went down, leader and follower, the plugin's lines and the series'
# (DIFFERENCES.md #2). A node SGLang killed (``kill_process_tree``) logs no server stop: its
# server went with the process, after its children (the sidecar among them).
SIDECAR_TOLD = "sending SIGTERM to sidecar"
DYNAMO_SIGTERM = "dynamo_sidecar_common::run: SIGTERM received"
DYNAMO_RAN = "dynamo_sglang_sidecar"  # the target of every line Dynamo's sidecar logs
SGLANG_KILLS_TREE = "kill_process_tree called"
FOLLOWER_SIGTERM_CHAINED = "SIGTERM on this follower node: stopping its metadata server"
STOPPED_FIRST = "sidecar told and stopped first"
SIDECAR_STOPPED = re.compile(rf"(leader|follower) sidecar {re.escape(dynamo.DYNAMO)} pid=")
SERVER_STOPPED = re.compile(
    r"gRPC server shutting down|[Ff]ollower metadata server( at \S+)? stopped"
)


def stop_order(node: nodes.Node) -> str:
    """Whether the node told its sidecar to stop (SIGTERM) and the sidecar stopped before the
    node's server, by the node's log (``STOPPED_FIRST`` when it did); where the node logs no
    sidecar stop (stock SGLang), whether the sidecar ran and got a SIGTERM at all (Dynamo's
    sidecar logs one)."""
    log = node.log_text()
    stopped = [m.start() for m in SIDECAR_STOPPED.finditer(log)]
    server = [m.start() for m in SERVER_STOPPED.finditer(log)]
    told = log.find(SIDECAR_TOLD)
    if not stopped:
        if told >= 0 and log.find(SGLANG_KILLS_TREE, told) >= 0:
            # SGLang's crash path (a peer left mid-step) killed the node while the sidecar
            # stopped: children first, the sidecar among them, then the node (its server).
            return STOPPED_FIRST
        if DYNAMO_RAN not in log:
            return "no sidecar ran on this node"
        if DYNAMO_SIGTERM not in log:
            return "sidecar never got SIGTERM (killed with the node's tree)"
        return "sidecar got SIGTERM; no stop order logged"
    if server and stopped[-1] > server[-1]:
        return "server stopped before its sidecar"
    if told < 0:
        return "sidecar stopped without a SIGTERM from the node"
    return STOPPED_FIRST


SCHEDULER_COMM = b"sglang::schedul"  # SGLang's title for a scheduler, cut to comm's 15 bytes


def scheduler_pid(node: nodes.Node) -> int | None:
    """One of ``node``'s scheduler processes (its first by pid)."""
    found = []
    for pid in node_pids(node):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_bytes().strip() == SCHEDULER_COMM:
                found.append(pid)
    return min(found) if found else None


def scheduler_killed(deployment: Deployment, column: str, *, node_index: int) -> Cell:
    """Row d: one scheduler of ``deployment.nodes[node_index]`` SIGKILLed while it serves.
    On deployment 2 (the follower's) the group fails stop as in row b: gone within
    ``GROUP_GONE`` seconds, every request in flight ended. On deployment 1 (one engine's, the
    frontend migrating) no request fails and the other engine serves on, the engine whose
    scheduler died gone within ``GROUP_GONE`` seconds."""
    node = deployment.nodes[node_index]
    group = deployment.nodes if node.node_rank > 0 else [node]
    single_engine = len(group) == 1
    cell = Cell("d1" if single_engine else "d2", column, "a scheduler SIGKILLed while serving")
    with loaded(deployment, cell, serves_after=single_engine) as flow:
        before = _targets(deployment)  # the load is warm: every worker is registered
        pid = nodes.wait_for(lambda: scheduler_pid(node), RECOVERY_DEADLINE, "a scheduler")
        os.kill(pid, signal.SIGKILL)
        fault_at = time.monotonic()
        if not single_engine:
            flow.stop_sending()  # the group goes: the requests in flight are the row's
        gone = cell.recovery["failed part gone"] = gone_within(group, fault_at)
        cell.left = sum(len(node_pids(n)) for n in group)
    cell.notes.append(f"exit codes { {n.name: n.proc.poll() for n in group} }")
    cell.expect(
        gone is not None and gone <= GROUP_GONE, f"failed part gone {seconds_or_never(gone)}"
    )
    cell.expect(cell.hung == 0, f"{cell.hung} hung")
    if single_engine:
        others = {w for w, _ in before} - node_workers(node)
        served = cell.recovery["served by the other engine"] = flow.measured().first_served_after(
            fault_at, others
        )
        cell.notes.append(f"{migrations(deployment)} requests migrated (the frontend's log)")
        cell.expect(cell.failed == 0, f"{cell.failed} failed: {cell.first_error}")
        cell.expect(served is not None, "the other engine served nothing after the fault")
    return cell


# What Dynamo's leader sidecar logs once it registered the node's engine as a worker.
WORKER_REGISTERED = re.compile(r"Initializing KvEventPublisher for worker (\d+)")


def node_workers(node: nodes.Node) -> set[int]:
    """Every Dynamo worker id ``node``'s engine was registered under (a restarted sidecar
    registers a new one), by the node's log."""
    return {int(worker) for worker in WORKER_REGISTERED.findall(node.log_text())}
