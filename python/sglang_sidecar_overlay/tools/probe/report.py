"""The probe's report model: findings, per-rank traffic, and the ``--json`` shape.

``ProbeReport`` is what every probe step fills in and what the CLI renders; ``ProbeError`` is
an expected failure to probe at all (closed port, timeout, not SGLang), one line long. A
finding names the field it is about by its JSON location, a tuple of keys and indices like
jsonschema's ``absolute_path`` (``("kv_event_sources", 0, "dp_rank")``), written out as
``kv_event_sources[0].dp_rank`` (``field_path``). ``CheckFindings`` builds one check's findings
and derives its OK line. ``FindingsReport`` is what a node's report and a group's share: the
findings' verdict, counts and JSON, on top of the tools' one :class:`Report`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO, TypedDict

from sglang_sidecar_overlay.tools.report import Line, Report, print_lines, verdict_line

__all__ = [
    "ERROR",
    "INFO",
    "OK",
    "WARNING",
    "CheckFindings",
    "Finding",
    "FindingsReport",
    "Health",
    "Location",
    "ProbeError",
    "ProbeReport",
    "RankTraffic",
    "consumers_json",
    "count_level",
    "field_path",
    "finding_lines",
    "passes",
]

OK = "ok"
INFO = "info"
WARNING = "warning"
ERROR = "error"


# Where in a node's server info a finding is: keys and list indices from the top.
Location = tuple[str | int, ...]


class Health(TypedDict):
    """A node's ``grpc.health.v1`` answer as the probe reports it (``rpc.read_health``)."""

    service: str
    status: str
    detail: str | None


def field_path(location: Location) -> str:
    """``kv_event_sources[0].dp_rank`` for ``("kv_event_sources", 0, "dp_rank")``."""
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What one consumer would register, against the ranks that exist."""

    consumer: str
    registers: int | None
    rank_space: int | None
    ok: bool
    # Why it is not ok, in one line naming the consumer; None when ok.
    reason: str | None
    # The one-line report either way.
    summary: str

    def to_json(self) -> dict[str, Any]:
        return {
            "registers": self.registers,
            "rank_space": self.rank_space,
            "ok": self.ok,
            "reason": self.reason,
        }


def consumers_json(verdicts: Iterable[Verdict]) -> dict[str, Any]:
    """``{"dynamo-1.6": {"registers", "rank_space", "ok", "reason"}, ...}``."""
    return {verdict.consumer: verdict.to_json() for verdict in verdicts}


def count_level(findings: Iterable[Finding], level: str) -> int:
    return sum(1 for finding in findings if finding.level == level)


def finding_lines(findings: Iterable[Finding]) -> list[Line]:
    """The human lines of ``findings``, each labelled by its field (else its check)."""
    return [
        (finding.level, finding.field or finding.check, finding.message) for finding in findings
    ]


def passes(findings: Sequence[Finding], *, strict: bool) -> bool:
    """The verdict on findings: no error, and no warning either when ``strict``."""
    if count_level(findings, ERROR):
        return False
    return not (strict and count_level(findings, WARNING))


class ProbeError(Exception):
    """The node could not be probed at all; ``kind`` says why, the message says it in one line."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclasses.dataclass
class Finding:
    """One line of the report: a passed check, a warning or an error about one field."""

    level: str
    check: str
    field: str | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class CheckFindings:
    """The findings of one check (one report ``check`` name), added rule by rule.

    :meth:`result` returns them, with the check's OK line first when it has one to give:
    the check found no error and the schema flagged nothing it reads.
    """

    def __init__(self, check: str) -> None:
        self.check = check
        self.found: list[Finding] = []

    def add(self, level: str, location: Location | None, message: str) -> None:
        field = None if location is None else field_path(location) or "json_info"
        self.found.append(Finding(level, self.check, field, message))

    def error(self, location: Location | None, message: str) -> None:
        self.add(ERROR, location, message)

    def warning(self, location: Location | None, message: str) -> None:
        self.add(WARNING, location, message)

    @property
    def has_error(self) -> bool:
        return any(finding.level == ERROR for finding in self.found)

    def result(
        self, ok: tuple[Location | None, str] | None = None, *, shapes_ok: bool = True
    ) -> list[Finding]:
        """The findings; ``ok`` (location, message) first when ``shapes_ok`` and no error."""
        if ok is None or not shapes_ok or self.has_error:
            return self.found
        location, message = ok
        passed = CheckFindings(self.check)
        passed.add(OK, location, message)
        return passed.found + self.found


def horizon_warning(item: RankTraffic) -> str:
    """What a consumer must do after a gap its replay cannot fill."""
    return (
        f"a live gap of {item.widest_gap} batches exceeds the replay horizon "
        f"(replay_buffer_steps {item.replay_buffer_steps}): replay cannot fill it, resync"
    )


@dataclasses.dataclass
class RankTraffic:
    """What one advertised publisher delivered during the listen window."""

    index: int
    dp_rank: Any
    endpoint: str
    topic: str
    replay_endpoint: str | None
    batches: int = 0
    events: int = 0
    replay_batches: int = 0
    replay_events: int = 0
    replay: str = "none"
    highest_seq: int | None = None
    seq_gaps: int = 0
    seq_resets: int = 0
    # The advertised replay horizon (contract v3; None when the source does not report one)
    # and the widest live gap seen, in missed batches.
    replay_buffer_steps: int | None = None
    widest_gap: int = 0
    stamped_ranks: set[Any] = dataclasses.field(default_factory=set)
    unstamped_batches: int = 0
    bad_messages: int = 0
    other_topics: int = 0
    last_bad: str | None = None
    _last_live_seq: int | None = None

    @property
    def beyond_replay_horizon(self) -> bool:
        """A live gap wider than the replay buffer: replay cannot fill it, a consumer resyncs."""
        steps = self.replay_buffer_steps
        return steps is not None and self.widest_gap > steps

    @property
    def rank_matches(self) -> bool | None:
        """True when every stamped batch carried the advertised rank; None before any stamp."""
        if not self.stamped_ranks:
            return None
        return self.stamped_ranks == {self.dp_rank}

    def to_json(self) -> dict[str, Any]:
        return {
            "dp_rank": self.dp_rank,
            "endpoint": self.endpoint,
            "topic": self.topic,
            "replay_endpoint": self.replay_endpoint,
            "batches": self.batches,
            "events": self.events,
            "replay_batches": self.replay_batches,
            "replay_events": self.replay_events,
            "replay": self.replay,
            "highest_seq": self.highest_seq,
            "seq_gaps": self.seq_gaps,
            "seq_resets": self.seq_resets,
            "widest_gap": self.widest_gap,
            "beyond_replay_horizon": self.beyond_replay_horizon,
            "stamped_ranks": sorted(self.stamped_ranks),
            "unstamped_batches": self.unstamped_batches,
            "rank_matches": self.rank_matches,
            "bad_messages": self.bad_messages,
        }


class FindingsReport(Report):
    """A report judged by its findings: a node's probe, or a group's.

    Subclasses are dataclasses with ``strict``, ``findings``, ``consumers`` and
    ``consumers_selected`` fields.
    """

    strict: bool
    findings: list[Finding]
    consumers: list[Verdict]
    consumers_selected: list[str]

    def count(self, level: str) -> int:
        return count_level(self.findings, level)

    @property
    def findings_pass(self) -> bool:
        """No error among the findings, and no warning either when ``strict``."""
        return passes(self.findings, strict=self.strict)

    def findings_json(self) -> dict[str, Any]:
        """The keys both ``--json`` objects share, in their documented order."""
        return {
            "checks": [finding.to_json() for finding in self.findings],
            "errors": self.count(ERROR),
            "warnings": self.count(WARNING),
            "consumers": consumers_json(self.consumers),
            "consumers_selected": self.consumers_selected,
        }


@dataclasses.dataclass
class ProbeReport(FindingsReport):
    """Everything ``probe`` learned about one node."""

    target: str
    strict: bool = False
    error: ProbeError | None = None
    server_info: dict[str, Any] | None = None
    server_info_bytes: int = 0
    findings: list[Finding] = dataclasses.field(default_factory=list)
    health: Health | None = None
    listen_seconds: float | None = None
    traffic: list[RankTraffic] = dataclasses.field(default_factory=list)
    # Every consumer rule's verdict on this node's reply, and the names that judge the probe.
    consumers: list[Verdict] = dataclasses.field(default_factory=list)
    consumers_selected: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing wrong: probed, no error, and no warning either when ``strict``."""
        return self.error is None and self.findings_pass

    @property
    def unreachable(self) -> bool:
        """The node could not be probed at all (exit 3)."""
        return self.error is not None

    def to_json(self) -> dict[str, Any]:
        """The stable ``probe --json`` object (documented in the operator guide)."""
        return {
            "target": self.target,
            "ok": self.ok,
            "strict": self.strict,
            "error": (
                None
                if self.error is None
                else {"kind": self.error.kind, "message": self.error.message}
            ),
            "server_info": self._summary(),
            "health": self.health,
            **self.findings_json(),
            "listen": (
                None
                if self.listen_seconds is None
                else {
                    "seconds": self.listen_seconds,
                    "ranks": [traffic.to_json() for traffic in self.traffic],
                }
            ),
        }

    def render(self, out: TextIO) -> None:
        """A line per finding and the verdict; a node that could not be probed: one stderr line."""
        if self.error is not None:
            print(f"probe: {self.error.message}", file=sys.stderr)
            return
        print(
            f"probe {self.target}: GetServerInfo answered ({self.server_info_bytes} bytes)",
            file=out,
        )
        print_lines(finding_lines(self.findings), out)
        warnings = self.count(WARNING)
        strict = " --strict" if self.strict and warnings else ""
        print(verdict_line(self.ok, self.count(ERROR), warnings) + strict, file=out)

    def _summary(self) -> dict[str, Any] | None:
        if self.server_info is None:
            return None
        info = self.server_info
        keys = (
            "node_rank",
            "nnodes",
            "dist_init_addr",
            "dp_size",
            "attn_dp_size",
            "enable_dp_attention",
            "disaggregation_mode",
            "kv_event_rank_space",
            "kv_events",
            "kv_event_sources",
            "contract_version",
            "incarnation",
        )
        summary = {key: info.get(key) for key in keys}
        summary["bytes"] = self.server_info_bytes
        return summary
