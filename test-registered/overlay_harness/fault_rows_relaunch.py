"""The fault table's relaunch rows (``overlay_harness.fault_rows`` has the cell, the load and
the shared measures): e, the orchestrator relaunching a whole group under load, and h, a decode
engine lost with KV transfers in flight, then relaunched."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

from overlay_harness import dynamo, fault_rows, kv_events, nodes, probes, seed_checks
from overlay_harness.deployments import Deployment
from overlay_harness.fault_rows import Cell


def incarnation_id(node: nodes.Node) -> str | None:
    """The node's ``GetServerInfo`` incarnation id; None where it reports none (stock)."""
    with contextlib.suppress(Exception):
        return (node.server_info().get("incarnation") or {}).get("id")
    return None


def cached_prompt(deployment: Deployment, target: seed_checks.Target) -> list[int] | None:
    """A new prompt pinned to ``target`` and served there; None when the router never scored
    it there (its events do not reach the router: stock's follower)."""
    prompt = kv_events.prompt(seed_checks.INPUT_TOKENS)
    (reply,) = deployment.frontend.generate_many([prompt], 1, 1, dynamo.pin(target))
    targets = list(deployment.router.target_scores(prompt))
    seen = seed_checks.events_seen(
        deployment.router, prompt, (target,), targets, fault_rows.SCORE_ATTEMPT
    )
    return prompt if "error" not in reply and seen is None else None


def launch_targets(deployment: Deployment, column: str) -> list[seed_checks.Target]:
    """The router's targets before the fault: every one of the deployment's, except on stock,
    whose follower's rank Dynamo 1.6.1 never learns (``docs/validation.md``): there, those it
    knows once the frontend serves."""
    if column != "stock":
        return seed_checks.registered_targets(deployment.router, deployment.targets)
    deployment.frontend.wait_for_model()
    seed_checks.first_served(deployment.frontend)
    return sorted(deployment.router.target_scores(kv_events.prompt()), key=lambda t: (t[1], t[0]))


def relaunched_targets(
    deployment: Deployment, old: set[int], count: int
) -> list[seed_checks.Target]:
    """The router's targets once it knows ``count`` of workers not in ``old``."""
    probe = kv_events.prompt()

    def fresh() -> list[seed_checks.Target]:
        targets = [t for t in deployment.router.target_scores(probe) if t[0] not in old]
        return sorted(targets) if len(targets) == count else []

    return nodes.wait_for(fresh, fault_rows.RECOVERY_DEADLINE, "the relaunched group's targets")


def group_relaunched(deployment: Deployment, column: str, grace: float = fault_rows.GRACE) -> Cell:
    """Row e (deployment 2): the orchestrator relaunches the whole group under load: stopped
    as in row f, then every node started again from its launch while the frontend and the
    routers run on. Every node comes back with a new incarnation; the router drops the old
    launch's workers and scores none of its blocks (a prompt cached before the relaunch,
    scored anywhere after it, would send its unpinned repeats to blocks that are gone: a stale
    routing decision); the targeted checks pass on the relaunched group, which serves the
    load again."""
    cell = Cell("e", column, "every node stopped (SIGTERM) and launched again")
    old_targets = launch_targets(deployment, column)
    if len(old_targets) < deployment.targets:
        cell.notes.append(f"the router knows {len(old_targets)} of the group's "
                          f"{deployment.targets} ranks: {old_targets}")  # fmt: skip
    before = {node.name: incarnation_id(node) for node in deployment.nodes}
    with fault_rows.loaded(deployment, cell, serves_after=False) as flow:
        cached = [cached_prompt(deployment, target) for target in old_targets]
        fault_at = time.monotonic()
        gone, cell.left = fault_rows.stop_as_orchestrator(deployment.nodes, grace,
                                               signalled=flow.stop_sending)  # fmt: skip
    cell.recovery["group gone"] = gone
    deployment.relaunch(list(deployment.nodes))
    cell.recovery["group ready again"] = time.monotonic() - fault_at
    targets = relaunched_targets(deployment, {w for w, _ in old_targets}, len(old_targets))
    cell.recovery["router knows the new workers"] = time.monotonic() - fault_at
    after = {node.name: incarnation_id(node) for node in deployment.nodes}
    lingering = {w for w, _ in deployment.router.target_scores(kv_events.prompt())} & {
        w for w, _ in old_targets
    }
    scored = [deployment.router.target_scores(p) for p in cached if p is not None]
    stale = [scores for scores in scored if any(scores.values())]
    again = seed_checks.targeted(deployment.frontend, deployment.router,
                                 seed_checks.aggregated_pins(targets), targets)  # fmt: skip
    with fault_rows.loaded(deployment, cell) as flow:
        flow.wait_served(fault_rows.AFTER_REQUESTS, fault_rows.AFTER_DEADLINE)
    cell.notes += [
        f"incarnations {before} then {after}",
        f"stale routing: {len(stale)} of {sum(p is not None for p in cached)} prompts cached "
        f"before the relaunch scored after it; old workers still known: {sorted(lingering)}",
        f"targeted on the relaunched group {again.passed}/{again.requests}",
    ]
    renewed = all(after[name] not in (None, before[name]) for name in after)
    cell.expect(renewed, f"incarnations {before} then {after}")
    cell.expect(not stale and not lingering, f"{len(stale)} stale, old workers {lingering}")
    cell.expect(again.passed == again.requests, f"targeted: {again.failures[:3]}")
    cell.expect(gone is not None, f"processes left after {grace:.0f} s: {cell.left}")
    cell.expect(cell.hung == 0, f"{cell.hung} hung")
    return cell


# Row h: how soon the prefill's KV cache must hold no more than it did idle.
KV_IDLE_AGAIN = 30.0


def used_tokens(node: nodes.Node) -> int | None:
    """KV tokens in use on ``node``'s engine over its DP ranks (SGLang's ``/v1/loads``,
    refreshed by an idle or stalled scheduler too); None when it does not answer."""
    status, text = node.inside(probes.http_text, node.http_port, node.address,
                               "/v1/loads?include=core")  # fmt: skip
    if status != 200:
        return None
    return sum(int(load["num_used_tokens"]) for load in json.loads(text)["loads"])


def prefill_used_tokens(deployment: Deployment) -> int | None:
    """KV tokens in use on the metered prefill engines; None when one does not answer."""
    used = [used_tokens(node) for node in deployment.metered]
    return None if None in used else sum(u for u in used if u is not None)


def kv_idle_within(deployment: Deployment, idle: int, since: float) -> float | None:
    """Seconds from ``since`` until the prefill engines hold no more KV tokens than ``idle``;
    None past the recovery deadline."""
    with contextlib.suppress(AssertionError):
        nodes.wait_for(lambda: (used := prefill_used_tokens(deployment)) is not None
                       and used <= idle, fault_rows.RECOVERY_DEADLINE, "")  # fmt: skip
        return time.monotonic() - since
    return None


def decode_lost(deployment: Deployment, column: str) -> Cell:
    """Row h (deployment 3): the last decode engine SIGKILLed with transfers in flight, then
    relaunched, the prefill engines running on. Their KV usage is back at its idle level within
    ``KV_IDLE_AGAIN`` seconds (nothing held for the lost decode), and requests after the
    relaunch are served."""
    cell = Cell("h", column, "a decode engine SIGKILLed with transfers in flight, relaunched")
    decode = deployment.decode[-1]  # the frontend and the routers run on the first one's host
    idle = prefill_used_tokens(deployment)
    with fault_rows.loaded(deployment, cell, serves_after=False) as flow:
        # Requests holding KV on the decode engine: pages it received, or is receiving.
        in_flight = nodes.wait_for(lambda: used_tokens(decode), fault_rows.RECOVERY_DEADLINE,
                                   f"KV in use on {decode.name}")  # fmt: skip
        on_prefill = prefill_used_tokens(deployment)
        fault_at = time.monotonic()
        os.killpg(decode.proc.pid, signal.SIGKILL)
        flow.stop_sending()  # the requests in flight are the row's
        gone = cell.recovery["decode gone"] = fault_rows.gone_within([decode], fault_at)
        cell.left = len(fault_rows.node_pids(decode))
        back = cell.recovery["prefill KV at idle"] = kv_idle_within(deployment, idle or 0, fault_at)
    decode.proc.wait(timeout=30)
    (relaunched,) = deployment.relaunch([decode])
    cell.recovery["decode relaunched"] = time.monotonic() - fault_at
    with fault_rows.loaded(deployment, cell):
        pass  # served again: ``fault_rows.loaded`` waits for requests after the relaunch
    after = prefill_used_tokens(deployment)
    cell.notes += [
        f"KV tokens in use at the fault: {in_flight} on {decode.name}, {on_prefill} on the "
        f"prefill engines (idle {idle}, at the end {after})",
        f"{fault_rows.migrations(deployment)} requests migrated (the frontend's log)",
        f"{relaunched.name} relaunched: exit code of the old one {decode.proc.returncode}",
    ]
    cell.expect(
        back is not None and back <= KV_IDLE_AGAIN,
        f"prefill KV at idle {fault_rows.seconds_or_never(back)}",
    )
    cell.expect(gone is not None, f"decode processes left: {cell.left}")
    cell.expect(cell.hung == 0, f"{cell.hung} hung")
    return cell
