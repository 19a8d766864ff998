"""What each released KV-event consumer would register for a node or a group, by its own rule.

A consumer reads a node's widths from ``GetServerInfo`` and registers that many DP ranks for
routing; the ranks that exist are ``kv_event_rank_space.size``. Each rule below says, once,
which widths a consumer release multiplies, how it checks a follower's sources against the
product, and how it compares a follower with its leader's registration (node_rank 0), in the
consumer's own words. ``node_verdicts`` judges one reply the way that node's sidecar would;
``group_verdicts`` judges a whole group the way the router ends up registering it.

A consumer whose registration is larger than the rank space routes to ranks that do not
exist (phantom); smaller, or a node it rejects, leaves ranks out (missing). ``select`` picks
the consumers that judge the probe (the ``--consumer`` option, else the node's ``sidecar``);
the others are reported for information. Pure: no SGLang, no network.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sglang_sidecar_overlay.contract.legacy_dp_size import DP_SIZE_CHECKING_SIDECARS
from sglang_sidecar_overlay.contract.values import is_int
from sglang_sidecar_overlay.tools.probe.checks import rank_space_size
from sglang_sidecar_overlay.tools.probe.report import ERROR, INFO, OK, Finding, Verdict
from sglang_sidecar_overlay.tools.probe.shapes import SHORT

__all__ = [
    "CHOICES",
    "CONSUMERS",
    "DYNAMO_1_6",
    "DYNAMO_1_7",
    "ConsumerRule",
    "Selection",
    "Verdict",
    "consumer_findings",
    "group_verdict",
    "group_verdicts",
    "node_verdict",
    "node_verdicts",
    "parse_consumers",
    "select",
]

CHECK = "consumers"
# Rank runs a reason lists before it only counts the rest.
_MAX_RUNS = 8
_DYNAMO_SIDECARS = DP_SIZE_CHECKING_SIDECARS
# Every known Dynamo release registers exactly the shape the dp_size switch serves (on by
# itself for a node whose --sidecar is Dynamo's), so the fix for any Dynamo verdict is the switch
# on every node.
_DYNAMO_ADVICE = (
    "leave SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE unset on nodes whose --sidecar is "
    "dynamo.sglang.sidecar, or set it to 1 on every node (the shape every Dynamo version "
    "registers exactly)"
)


@dataclasses.dataclass(frozen=True)
class ConsumerRule:
    """One consumer release's reading of a node's widths.

    ``widths`` are the top-level keys it multiplies into the size it validates and registers;
    the first must be a positive integer, a later one absent (or null) counts as 1.
    ``outside`` and ``mismatch`` are its messages (``{rank}``, ``{size}`` filled in) for a
    follower source at or past that size and for a follower whose size differs from the
    leader's registration.
    """

    name: str
    versions: str
    widths: tuple[str, ...]
    size_name: str
    outside: str
    mismatch: str
    advice: str
    sidecars: frozenset[str]

    def size(self, info: Mapping[str, Any]) -> int | None:
        """The size this consumer reads from ``info``; None when it cannot read one."""
        first = info.get(self.widths[0])
        if not is_int(first) or first < 1:
            return None
        size = first
        for key in self.widths[1:]:
            value = info.get(key)
            if value is None:
                continue
            if not is_int(value) or value < 1:
                return None
            size *= value
        return size

    def describe(self, info: Mapping[str, Any]) -> str:
        """``dp_size 2 × attn_dp_size 2`` (or ``dp_size 2, no attn_dp_size``) from the reply."""
        present = [key for key in self.widths if key == self.widths[0] or info.get(key) is not None]
        absent = [key for key in self.widths if key not in present]
        text = " × ".join(f"{key} {SHORT.repr(info.get(key))}" for key in present)
        return text + "".join(f", no {key}" for key in absent)


DYNAMO_1_6 = ConsumerRule(
    name="dynamo-1.6",
    versions="ai-dynamo <= 1.6.1",
    widths=("dp_size",),
    size_name="dp_size",
    outside="KV source rank {rank} is outside dp_size {size}",
    mismatch="GetServerInfo dp_size does not match leader registration",
    advice=_DYNAMO_ADVICE,
    sidecars=_DYNAMO_SIDECARS,
)
DYNAMO_1_7 = ConsumerRule(
    name="dynamo-1.7",
    versions="ai-dynamo >= 1.7.0.dev20261026",
    widths=("dp_size", "attn_dp_size"),
    size_name="deployment DP size",
    # The rank check's wording is this project's; the mismatch message is the release's.
    outside="KV source rank {rank} is outside deployment DP size {size}",
    mismatch="GetServerInfo deployment DP size does not match leader registration",
    advice=_DYNAMO_ADVICE,
    sidecars=_DYNAMO_SIDECARS,
)
CONSUMERS: tuple[ConsumerRule, ...] = (DYNAMO_1_6, DYNAMO_1_7)
# What ``--consumer`` accepts: one rule by name, ``dynamo`` (every Dynamo rule) or ``any``
# (every rule the probe knows).
_GROUPS: dict[str, tuple[ConsumerRule, ...]] = {
    **{rule.name: (rule,) for rule in CONSUMERS},
    "dynamo": (DYNAMO_1_6, DYNAMO_1_7),
    "any": CONSUMERS,
}
CHOICES: tuple[str, ...] = tuple(_GROUPS)


@dataclasses.dataclass(frozen=True)
class Selection:
    """The consumers that judge a probe, and where that choice came from."""

    rules: tuple[ConsumerRule, ...]
    source: str

    @property
    def names(self) -> list[str]:
        return [rule.name for rule in self.rules]

    def selects(self, name: str) -> bool:
        return name in self.names

    def describe(self) -> str:
        if not self.rules:
            return f"information only, no consumer judges this probe ({self.source})"
        return f"judged for {', '.join(self.names)} ({self.source})"


def parse_consumers(text: str) -> list[str]:
    """Names from one ``--consumer`` value (comma-separated); ValueError naming a bad one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError(f"{text!r} names no consumer; choose from {', '.join(CHOICES)}")
    for name in names:
        if name not in _GROUPS:
            raise ValueError(f"unknown consumer {name!r}; choose from {', '.join(CHOICES)}")
    return names


def select(names: Sequence[str] | None, infos: Iterable[Mapping[str, Any]]) -> Selection:
    """The judging consumers: ``names`` when given (``--consumer``), else those the nodes'
    ``sidecar`` server argument runs; none when neither says."""
    if names is not None:
        picked = {rule.name for name in names for rule in _GROUPS[name]}
        rules = tuple(rule for rule in CONSUMERS if rule.name in picked)
        return Selection(rules, "--consumer" if rules else "none named")
    sidecars = sorted(
        {info["sidecar"] for info in infos if isinstance(info.get("sidecar"), str)} - {""}
    )
    rules = tuple(rule for rule in CONSUMERS if rule.sidecars.intersection(sidecars))
    named = ", ".join(SHORT.repr(sidecar) for sidecar in sidecars)
    if rules:
        return Selection(rules, f"the node's sidecar {named}")
    if not sidecars:
        return Selection((), "no --consumer, no sidecar")
    return Selection((), f"no --consumer; sidecar {named} is no consumer the probe knows")


# --- verdicts ----------------------------------------------------------------------------------


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' * (count != 1)}"


def _ranks_text(ranks: Sequence[int]) -> str:
    """``rank 1``, ``ranks 2, 3``, ``ranks 2..63``: runs of 3+ collapsed, at most 8 runs shown.

    A ``range`` is read by its ends, so a hostile width never becomes a list."""
    if isinstance(ranks, range):
        runs = [(ranks.start, ranks.stop - 1)] if ranks.stop > ranks.start else []
        count = max(0, ranks.stop - ranks.start)
    else:
        runs = []
        for rank in sorted(ranks):
            if runs and rank == runs[-1][1] + 1:
                runs[-1] = (runs[-1][0], rank)
            else:
                runs.append((rank, rank))
        count = len(ranks)
    parts = [
        f"{first}..{last}" if last - first > 1 else ", ".join(map(str, range(first, last + 1)))
        for first, last in runs[:_MAX_RUNS]
    ]
    more = f", … ({count} in all)" if len(runs) > _MAX_RUNS else ""
    return f"rank{'s' * (count != 1)} {', '.join(parts)}{more}"


def _node_ranks(info: Mapping[str, Any]) -> list[int]:
    sources = info.get("kv_event_sources")
    ranks = {
        source.get("dp_rank")
        for source in (sources if isinstance(sources, list) else [])
        if isinstance(source, dict)
    }
    return sorted(rank for rank in ranks if is_int(rank))


def _space(info: Mapping[str, Any]) -> int | None:
    return rank_space_size(info)[0]


def _registration(
    rule: ConsumerRule, registers: int, space: int, info: Mapping[str, Any]
) -> tuple[bool, str]:
    """(whether registering ``registers`` ranks of ``space`` is wrong, the one-line account)."""
    widths = rule.describe(info)
    if registers == space:
        return False, (
            f"{rule.name} registers {_plural(registers, 'DP rank')} = rank space {space} ({widths})"
        )
    head = f"{rule.name} would register {_plural(registers, 'DP rank')} for a rank space of {space}"
    wrong = range(space, registers) if registers > space else range(registers, space)
    verb = "is" if wrong.stop - wrong.start == 1 else "are"
    what = "phantom" if registers > space else "missing"
    return True, f"{head}: {_ranks_text(wrong)} {verb} {what} ({widths})"


def _unreadable(rule: ConsumerRule, info: Mapping[str, Any], where: str) -> str:
    return (
        f"{rule.name} cannot register {where}: {rule.describe(info)} is no positive "
        f"{rule.size_name}"
    )


def _is_leader(info: Mapping[str, Any]) -> bool:
    """node_rank 0 (or none given: a single node); a bool is no node_rank."""
    rank = info.get("node_rank", 0)
    return is_int(rank) and rank == 0


def _rejection(rule: ConsumerRule, info: Mapping[str, Any], size: int) -> str | None:
    """The consumer's message for the first of a follower's sources it refuses, if any."""
    outside = [rank for rank in _node_ranks(info) if rank >= size]
    if not outside or _is_leader(info):
        return None
    return rule.outside.format(rank=outside[0], size=size)


def _verdict(
    rule: ConsumerRule,
    registers: int | None,
    space: int | None,
    problems: list[str],
    account: str,
) -> Verdict:
    reason = "; ".join(problems) if problems else None
    return Verdict(
        consumer=rule.name,
        registers=registers,
        rank_space=space,
        ok=reason is None,
        reason=reason,
        summary=reason or account,
    )


def node_verdict(rule: ConsumerRule, info: Mapping[str, Any]) -> Verdict:
    """What ``rule`` makes of one node's reply: its own registration and, on a follower, the
    check of its sources (the comparison with the leader needs the group)."""
    space = _space(info)
    size = rule.size(info)
    if size is None:
        return _verdict(rule, None, space, [_unreadable(rule, info, "this node")], "")
    problems = []
    refused = _rejection(rule, info, size)
    if refused is not None:
        lost = _node_ranks(info)
        problems.append(
            f'{rule.name} rejects this node: "{refused}" ({_ranks_text(lost)} never routed)'
        )
    if space is None:
        problems.append(f"{rule.name} registers {size}, but the reply has no rank space")
        return _verdict(rule, size, None, problems, "")
    wrong, account = _registration(rule, size, space, info)
    if wrong:
        problems.append(account)
    return _verdict(rule, size, space, problems, account)


def node_verdicts(info: Mapping[str, Any]) -> list[Verdict]:
    """Every known consumer's verdict on one node's reply."""
    return [node_verdict(rule, info) for rule in CONSUMERS]


def group_verdict(rule: ConsumerRule, nodes: Sequence[tuple[str, Mapping[str, Any]]]) -> Verdict:
    """What ``rule`` registers for a group: the leader's (node_rank 0) size, every follower
    checked against its own size and the leader's registration. ``nodes`` are (label, reply)."""
    spaces = {_space(info) for _label, info in nodes}
    space = next(iter(spaces)) if len(spaces) == 1 else None
    leaders = [(label, info) for label, info in nodes if _is_leader(info)]
    if len(leaders) != 1:
        which = "no node answered" if not leaders else f"{len(leaders)} nodes answer"
        problem = f"{rule.name} cannot tell the leader's registration: {which} as node_rank 0"
        return _verdict(rule, None, space, [problem], "")
    leader_label, leader = leaders[0]
    registers = rule.size(leader)
    if registers is None:
        problem = _unreadable(rule, leader, f"the leader {leader_label}")
        return _verdict(rule, None, space, [problem], "")
    problems: list[str] = []
    lost: set[int] = set()
    for label, info in nodes:
        if _is_leader(info):
            continue
        size = rule.size(info)
        if size is None:
            problems.append(_unreadable(rule, info, label))
            lost.update(_node_ranks(info))
            continue
        refused = _rejection(rule, info, size)
        if refused is None and size != registers:
            problems.append(
                f'{rule.name} rejects {label}: "{rule.mismatch}" '
                f"(its {rule.size_name} {size}, the leader registered {registers})"
            )
        elif refused is not None:
            problems.append(f'{rule.name} rejects {label}: "{refused}"')
        else:
            continue
        lost.update(_node_ranks(info))
    if space is None:
        problems.append(
            f"{rule.name} registers {registers}, but the nodes do not give one rank space"
        )
        return _verdict(rule, registers, None, problems, "")
    wrong, account = _registration(rule, registers, space, leader)
    if wrong:
        problems.append(account)
    unrouted = sorted(rank for rank in lost if rank < min(registers, space))
    if unrouted:
        problems.append(f"{_ranks_text(unrouted)} never routed")
    return _verdict(rule, registers, space, problems, account)


def group_verdicts(nodes: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Verdict]:
    """Every known consumer's verdict on a group's replies, (label, reply) per answered node."""
    return [group_verdict(rule, nodes) for rule in CONSUMERS]


# --- findings ----------------------------------------------------------------------------------


def consumer_findings(verdicts: Sequence[Verdict], selection: Selection) -> list[Finding]:
    """The report's lines: which consumers judge, then one line per consumer rule.

    A judging consumer's verdict is an OK or an ERROR finding (with what to do); any other
    consumer's is information and never fails the probe.
    """
    rules = {rule.name: rule for rule in CONSUMERS}
    found = [Finding(INFO, CHECK, None, selection.describe())]
    for verdict in verdicts:
        if not selection.selects(verdict.consumer):
            found.append(Finding(INFO, CHECK, None, verdict.summary))
        elif verdict.ok:
            found.append(Finding(OK, CHECK, None, verdict.summary))
        else:
            advice = rules[verdict.consumer].advice
            found.append(Finding(ERROR, CHECK, None, f"{verdict.reason}; {advice}"))
    return found
