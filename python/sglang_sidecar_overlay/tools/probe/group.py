"""Probe a whole engine group the way a router needs it: every node, then the group's rules.

``run_group_probe`` probes every ``HOST:PORT`` given (any order) with the single-node probe,
in parallel, then checks what only the group as a whole can say:

- one ``dist_init_addr`` and one ``nnodes``; exactly ``nnodes`` nodes with distinct
  ``node_rank`` in ``range(nnodes)``;
- one rank space (``kv_event_rank_space`` widths);
- what each released consumer registers for the group (``consumers``): the leader's
  (node_rank 0) registration against the rank space, every follower checked against its own
  widths and the leader's registration; the judging consumers fail the group;
- the union of ``kv_event_sources`` covers every publisher rank of the space exactly once: a
  missing rank is named with the node SGLang places it on (rank × nnodes ÷ size), a doubled
  rank with every node advertising it;
- one block size, one topic and one encoding across every rank;
- every node answered and passed its own probe (health included).

Advertised endpoints are node-local, so listeners are dialled only for nodes whose address
belongs to this machine; the others are checked for shape only.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any, TextIO

from sglang_sidecar_overlay.contract.values import is_int
from sglang_sidecar_overlay.tools.probe.consumers import (
    Verdict,
    consumer_findings,
    group_verdicts,
    select,
)
from sglang_sidecar_overlay.tools.probe.report import (
    ERROR,
    OK,
    WARNING,
    Finding,
    FindingsReport,
    ProbeError,
    ProbeReport,
    finding_lines,
)
from sglang_sidecar_overlay.tools.probe.rpc import DEFAULT_TIMEOUT, parse_target
from sglang_sidecar_overlay.tools.report import print_lines, verdict_line

__all__ = [
    "GroupReport",
    "check_group",
    "expected_node_rank",
    "is_local_host",
    "node_lines",
    "run_group_probe",
    "target_is_local",
]

GROUP = "group"


def expected_node_rank(rank: int, size: int, nnodes: int) -> int:
    """The node SGLang places publisher ``rank`` on: ranks are spread evenly, in order."""
    return rank * nnodes // size


def is_local_host(host: str) -> bool:
    """Whether ``host`` names this machine (so its node-local endpoints are dialable here)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _type, _proto, _name, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((address[0], 0, *address[2:]))
                return True
        except OSError:
            continue
    return False


@dataclasses.dataclass
class GroupReport(FindingsReport):
    """Every node's probe report plus the group-level findings."""

    targets: list[str]
    strict: bool = False
    nodes: list[ProbeReport] = dataclasses.field(default_factory=list)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    # rank -> [(node_rank, target)] for every advertised rank.
    owners: dict[int, list[tuple[Any, str]]] = dataclasses.field(default_factory=dict)
    rank_space_size: int | None = None
    # ``--consumer`` names (None: the nodes' sidecar decides), every consumer rule's verdict
    # on the group, and the names that judge it.
    consumer_names: Sequence[str] | None = None
    consumers: list[Verdict] = dataclasses.field(default_factory=list)
    consumers_selected: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every node passed its own probe and the group's findings pass."""
        return all(node.ok for node in self.nodes) and self.findings_pass

    @property
    def unreachable(self) -> bool:
        """No node could be probed at all (exit 3; some nodes down is exit 1)."""
        return bool(self.nodes) and all(node.error is not None for node in self.nodes)

    def to_json(self) -> dict[str, Any]:
        """The stable ``probe --group --json`` object (documented in the operator guide)."""
        return {
            "targets": self.targets,
            "ok": self.ok,
            "strict": self.strict,
            "rank_space_size": self.rank_space_size,
            "ranks": {
                str(rank): [{"node_rank": node, "target": target} for node, target in owners]
                for rank, owners in sorted(self.owners.items())
            },
            **self.findings_json(),
            "nodes": [node.to_json() for node in self.nodes],
        }

    def render(self, out: TextIO) -> None:
        """A line per node, each node's problems, the group's lines, then the verdict."""
        print(f"probe --group: {len(self.targets)} node(s)", file=out)
        for line in node_lines(self):
            print(line, file=out)
        for node in self.nodes:
            bad = [f for f in node.findings if f.level in (ERROR, WARNING)]
            if bad:
                print(f"  {node.target}:", file=out)
                print_lines(finding_lines(bad), out, "      ")
        print("group:", file=out)
        print_lines(finding_lines(self.findings), out)
        errors = self.count(ERROR) + sum(node.count(ERROR) for node in self.nodes)
        warnings = self.count(WARNING) + sum(node.count(WARNING) for node in self.nodes)
        print(verdict_line(self.ok, errors, warnings), file=out)


def node_lines(report: GroupReport) -> list[str]:
    """One line per node: node_rank, address, its ranks, health, launch."""
    lines = []
    for node in sorted(
        report.nodes, key=lambda n: repr((n.server_info or {}).get("node_rank", n.target))
    ):
        if node.error is not None:
            lines.append(f"  {node.target}: not probed ({node.error.kind})")
            continue
        info = node.server_info or {}
        sources = info.get("kv_event_sources")
        ranks = (
            ",".join(str(s.get("dp_rank")) for s in sources if isinstance(s, dict))
            if isinstance(sources, list)
            else "?"
        )
        launch = info.get("incarnation")
        launch_id = launch.get("id") if isinstance(launch, dict) else None
        health = node.health.get("status") if node.health else None
        lines.append(
            f"  node_rank {info.get('node_rank')}  {node.target}  ranks {ranks or 'none'}  "
            f"health {health}  launch {str(launch_id)[:12]}"
        )
    return lines


def run_group_probe(
    targets: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    listen_seconds: float | None = None,
    strict: bool = False,
    probe_node: Callable[..., ProbeReport] | None = None,
    consumers: Sequence[str] | None = None,
) -> GroupReport:
    """Probe every target in parallel and check the group; never raises for expected failures.

    ``consumers`` (``--consumer`` names) judge the group; None: those the nodes' ``sidecar``
    runs, if any. Each node's own consumer verdicts are information: the group's decide.
    """
    from sglang_sidecar_overlay.tools.probe import run_probe

    probe_node = probe_node or run_probe
    report = GroupReport(targets=list(targets), strict=strict, consumer_names=consumers)

    def one(target: str) -> ProbeReport:
        return probe_node(
            target,
            timeout=timeout,
            listen_seconds=listen_seconds,
            strict=strict,
            dial_endpoints=target_is_local(target),
            consumers=(),
        )

    with futures.ThreadPoolExecutor(max_workers=max(1, min(8, len(targets)))) as pool:
        report.nodes = list(pool.map(one, targets))
    report.findings = check_group(report)
    return report


def target_is_local(target: str) -> bool:
    """Whether the node at ``target`` (HOST:PORT) is this machine."""
    try:
        host, _port = parse_target(target)
    except ProbeError:
        return False
    return is_local_host(host)


def _node_label(node: ProbeReport) -> str:
    info = node.server_info or {}
    rank = info.get("node_rank")
    return f"node_rank {rank} ({node.target})" if rank is not None else node.target


def check_group(report: GroupReport) -> list[Finding]:
    """The group-level findings over the nodes' probe reports (already filled in)."""
    found: list[Finding] = []
    answered = [node for node in report.nodes if node.server_info is not None]
    for node in report.nodes:
        if node.error is not None:
            found.append(Finding(ERROR, GROUP, node.target, f"not probed: {node.error.message}"))
        elif not node.ok:
            errors, warnings = node.count(ERROR), node.count(WARNING)
            found.append(
                Finding(
                    ERROR,
                    GROUP,
                    _node_label(node),
                    f"fails its own probe ({errors} error(s), {warnings} warning(s))",
                )
            )
    if not answered:
        return found
    found += _check_same(answered, "dist_init_addr", "one dist_init_addr per group")
    found += _check_same(answered, "nnodes", "one nnodes per group")
    found += _check_rank_space(answered)
    found += _check_consumers(report, answered)
    found += _check_nodes(report, answered)
    found += _check_ranks(report, answered)
    found += _check_source_agreement(answered)
    if not any(finding.level == ERROR for finding in found):
        info = answered[0].server_info or {}
        found.insert(
            0,
            Finding(
                OK,
                GROUP,
                None,
                f"{len(answered)} node(s) of {info.get('nnodes')}, dist_init_addr "
                f"{info.get('dist_init_addr')!r}, ranks 0..{(report.rank_space_size or 1) - 1} "
                "each advertised exactly once",
            ),
        )
    return found


def _check_same(nodes: list[ProbeReport], key: str, why: str) -> list[Finding]:
    values: dict[str, list[str]] = {}
    for node in nodes:
        values.setdefault(repr((node.server_info or {}).get(key)), []).append(_node_label(node))
    if len(values) <= 1:
        return []
    described = "; ".join(f"{value} on {', '.join(labels)}" for value, labels in values.items())
    return [Finding(ERROR, GROUP, key, f"differs across nodes ({why}): {described}")]


def _check_consumers(report: GroupReport, nodes: list[ProbeReport]) -> list[Finding]:
    """What each consumer rule registers for the group; the selected ones judge it."""
    replies = [(_node_label(node), node.server_info or {}) for node in nodes]
    selection = select(report.consumer_names, [info for _label, info in replies])
    report.consumers = group_verdicts(replies)
    report.consumers_selected = selection.names
    return consumer_findings(report.consumers, selection)


def _space_of(node: ProbeReport) -> tuple[Any, ...] | None:
    space = (node.server_info or {}).get("kv_event_rank_space")
    if not isinstance(space, dict):
        return None
    return tuple(space.get(key) for key in ("size", "system_dp_size", "attn_dp_size"))


def _check_rank_space(nodes: list[ProbeReport]) -> list[Finding]:
    spaces: dict[tuple[Any, ...] | None, list[str]] = {}
    for node in nodes:
        spaces.setdefault(_space_of(node), []).append(_node_label(node))
    if len(spaces) <= 1:
        return []
    described = "; ".join(
        f"{_describe_space(space)} on {', '.join(labels)}" for space, labels in spaces.items()
    )
    return [
        Finding(ERROR, GROUP, "kv_event_rank_space", f"one rank space per group, got: {described}")
    ]


def _describe_space(space: tuple[Any, ...] | None) -> str:
    if space is None:
        return "none"
    size, system, attn = space
    return f"size {size} (system_dp {system} × attn_dp {attn})"


def _group_shape(nodes: list[ProbeReport]) -> tuple[int | None, int | None]:
    """(nnodes, rank space size) when every node agrees on them, else None for that part."""
    nnodes = {(node.server_info or {}).get("nnodes") for node in nodes}
    sizes = {(_space_of(node) or (None,))[0] for node in nodes}
    one_nnodes = next(iter(nnodes)) if len(nnodes) == 1 else None
    one_size = next(iter(sizes)) if len(sizes) == 1 else None
    return (
        one_nnodes if is_int(one_nnodes) and one_nnodes >= 1 else None,
        one_size if is_int(one_size) and one_size >= 1 else None,
    )


def _check_nodes(report: GroupReport, nodes: list[ProbeReport]) -> list[Finding]:
    found: list[Finding] = []
    nnodes, _size = _group_shape(nodes)
    by_rank: dict[Any, list[str]] = {}
    for node in nodes:
        by_rank.setdefault((node.server_info or {}).get("node_rank"), []).append(node.target)
    for node_rank, targets in sorted(by_rank.items(), key=lambda item: repr(item[0])):
        if len(targets) > 1:
            found.append(
                Finding(
                    ERROR,
                    GROUP,
                    "node_rank",
                    f"node_rank {node_rank} is claimed by {len(targets)} nodes: "
                    f"{', '.join(targets)}",
                )
            )
    if nnodes is None:
        return found
    if len(report.targets) != nnodes:
        found.append(
            Finding(
                ERROR,
                GROUP,
                "nnodes",
                f"the group has nnodes={nnodes} but {len(report.targets)} address(es) were given",
            )
        )
    for node_rank in range(nnodes):
        if node_rank not in by_rank:
            found.append(
                Finding(
                    ERROR,
                    GROUP,
                    "node_rank",
                    f"node_rank {node_rank} of {nnodes}: no node given answered as it",
                )
            )
    return found


def _target_of(nodes: list[ProbeReport], node_rank: int) -> str | None:
    for node in nodes:
        if (node.server_info or {}).get("node_rank") == node_rank:
            return node.target
    return None


def _check_ranks(report: GroupReport, nodes: list[ProbeReport]) -> list[Finding]:
    found: list[Finding] = []
    owners: dict[int, list[tuple[Any, str]]] = {}
    for node in nodes:
        info = node.server_info or {}
        sources = info.get("kv_event_sources")
        for source in sources if isinstance(sources, list) else []:
            rank = source.get("dp_rank") if isinstance(source, dict) else None
            if is_int(rank):
                owners.setdefault(rank, []).append((info.get("node_rank"), node.target))
    report.owners = owners
    nnodes, size = _group_shape(nodes)
    report.rank_space_size = size
    for rank, where in sorted(owners.items()):
        if len(where) > 1:
            described = ", ".join(f"node_rank {node} ({target})" for node, target in where)
            found.append(
                Finding(ERROR, GROUP, f"rank {rank}", f"advertised more than once: by {described}")
            )
        if size is not None and rank >= size:
            found.append(
                Finding(
                    ERROR,
                    GROUP,
                    f"rank {rank}",
                    f"outside the group's rank space of size {size}",
                )
            )
    if size is None:
        return found
    for rank in range(size):
        if rank in owners:
            continue
        if nnodes is None:
            found.append(Finding(ERROR, GROUP, f"rank {rank}", "no node advertises it"))
            continue
        expected = expected_node_rank(rank, size, nnodes)
        target = _target_of(nodes, expected) or _unanswered_target(report, nodes)
        expected_on = f"node_rank {expected}" + (f" ({target})" if target else " (not given)")
        found.append(
            Finding(
                ERROR,
                GROUP,
                f"rank {rank}",
                f"no node advertises it; expected on {expected_on}: is its publisher missing?",
            )
        )
    return found


def _unanswered_target(report: GroupReport, nodes: list[ProbeReport]) -> str | None:
    """The one target that did not answer, when exactly one did not (it must be that node)."""
    silent = [node.target for node in report.nodes if node.server_info is None]
    return f"{silent[0]}, not answering" if len(silent) == 1 else None


def _check_source_agreement(nodes: list[ProbeReport]) -> list[Finding]:
    found: list[Finding] = []
    for key, why in (
        ("block_size", "a router hashes every rank with one block size"),
        ("topic", "one topic per group"),
        ("encoding", "one batch encoding per group"),
    ):
        values: dict[str, list[str]] = {}
        for node in nodes:
            sources = (node.server_info or {}).get("kv_event_sources")
            for source in sources if isinstance(sources, list) else []:
                if isinstance(source, dict):
                    label = f"rank {source.get('dp_rank')}"
                    values.setdefault(repr(source.get(key)), []).append(label)
        if len(values) > 1:
            described = "; ".join(
                f"{value} on {', '.join(ranks)}" for value, ranks in values.items()
            )
            found.append(Finding(ERROR, GROUP, key, f"differs across ranks ({why}): {described}"))
    return found
