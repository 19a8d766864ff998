"""``probe --watch``: a live view of one node or a group, per publisher rank.

Every node's server info and health are re-read every ``refresh`` seconds (a new
``incarnation`` means the node was relaunched: its subscriptions are rebuilt and the restart
is counted); every advertised publisher stays subscribed, with a replay request from seq 0
when it has a replay endpoint, exactly as a router would. Every ``interval`` seconds the view
is drawn: on a terminal a compact table redrawn in place, otherwise one line per rank (for
logs and pipes). Ctrl-C or SIGTERM stops cleanly; ``duration`` bounds the run. Without an
output stream nothing is drawn; either way the run returns a ``WatchReport`` whose JSON holds
every rank's figures as they stood at the end (``probe --watch SECONDS --json``).

SIGINT keeps the disposition the watch inherited: whoever started it with SIGINT ignored (a
shell's background job, a CI wrapper) did so that a terminal's Ctrl-C reaches the foreground
job only, and overriding that would let a Ctrl-C meant for another job stop this one. Such a
watch is stopped with SIGTERM, which ends it as cleanly as Ctrl-C (cursor shown again, exit 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from sglang_sidecar_overlay.tools.probe.listen import Subscriptions
from sglang_sidecar_overlay.tools.probe.report import ProbeError, RankTraffic, horizon_warning
from sglang_sidecar_overlay.tools.probe.rpc import (
    fetch_server_info,
    grpc_target,
    parse_target,
    read_health,
)
from sglang_sidecar_overlay.tools.report import Report

__all__ = ["NodeView", "WatchReport", "run_watch"]

_HOME_CLEAR = "\x1b[H\x1b[J"
_HIDE_CURSOR = "\x1b[?25l"
_SHOW_CURSOR = "\x1b[?25h"
_COLUMNS = ("NODE", "RANK", "EVENTS/S", "LAST SEQ", "GAPS", "RESETS", "REPLAYED", "HEALTH")


@dataclasses.dataclass
class NodeView:
    """What the watch knows about one node between two refreshes."""

    target: str
    dial_endpoints: bool = True
    info: dict[str, Any] | None = None
    health: str = "?"
    error: str | None = None
    incarnation: str | None = None
    relaunches: int = 0
    subscriptions: Subscriptions | None = None
    _counted: dict[int, tuple[int, float]] = dataclasses.field(default_factory=dict)
    rates: dict[int, float] = dataclasses.field(default_factory=dict)

    @property
    def node_rank(self) -> Any:
        return None if self.info is None else self.info.get("node_rank")

    @property
    def traffic(self) -> list[RankTraffic]:
        return [] if self.subscriptions is None else self.subscriptions.traffic

    def refresh(self, timeout: float) -> None:
        """Re-read server info and health; resubscribe when the node was relaunched."""
        try:
            host, port = parse_target(self.target)
            address = grpc_target(host, port)
            text = fetch_server_info(address, timeout)
        except ProbeError as exc:
            self.error = exc.message
            self.health = "DOWN"
            return
        import json

        try:
            info = json.loads(text)
        except ValueError:
            self.error = "GetServerInfo is not JSON"
            return
        self.error = None
        self.health = read_health(address, timeout)["status"]
        launch = info.get("incarnation") if isinstance(info, dict) else None
        launch_id = launch.get("id") if isinstance(launch, dict) else None
        if self.info is not None and launch_id != self.incarnation:
            self.relaunches += 1
            self.close()
        self.info = info if isinstance(info, dict) else None
        self.incarnation = launch_id
        if self.subscriptions is None and self.info is not None:
            self.subscriptions = Subscriptions(self._sources())
            self._counted.clear()

    def _sources(self) -> list[dict[str, Any]]:
        from sglang_sidecar_overlay.tools.probe import _dialable_sources, node_local

        sources = _dialable_sources((self.info or {}).get("kv_event_sources"))
        if self.dial_endpoints:
            return sources
        kept = []
        for source in sources:
            if node_local(source.get("endpoint")):
                continue
            if node_local(source.get("replay_endpoint")):
                source = {**source, "replay_endpoint": None}
            kept.append(source)
        return kept

    def poll(self, seconds: float) -> None:
        if self.subscriptions is not None and self.subscriptions.active:
            self.subscriptions.poll(seconds)

    def update_rates(self, now: float) -> None:
        for item in self.traffic:
            events = item.events
            before = self._counted.get(item.index)
            if before is not None and now > before[1]:
                self.rates[item.index] = (events - before[0]) / (now - before[1])
            self._counted[item.index] = (events, now)

    def to_json(self) -> dict[str, Any]:
        """What the view shows for this node now, one entry per rank (its columns)."""
        return {
            "target": self.target,
            "node_rank": self.node_rank,
            "launch": self.incarnation,
            "relaunches": self.relaunches,
            "health": self.health if self.error is None else "DOWN",
            "error": self.error,
            "ranks": [
                {
                    "dp_rank": item.dp_rank,
                    "events": item.events,
                    "events_per_s": self.rates.get(item.index),
                    "last_seq": item.highest_seq,
                    "gaps": item.seq_gaps,
                    "resets": item.seq_resets + self.relaunches,
                    "replayed": item.replay_batches,
                    "beyond_replay_horizon": item.beyond_replay_horizon,
                }
                for item in self.traffic
            ],
        }

    def close(self) -> None:
        if self.subscriptions is not None:
            self.subscriptions.close()
            self.subscriptions = None
        self.rates.clear()


def _rows(nodes: Sequence[NodeView]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for node in sorted(nodes, key=lambda n: (repr(n.node_rank), n.target)):
        label = node.target if node.node_rank is None else str(node.node_rank)
        health = node.health if node.error is None else "DOWN"
        if not node.traffic:
            rows.append((label, "-", "-", "-", "-", str(node.relaunches), "-", health))
            continue
        for item in node.traffic:
            rate = node.rates.get(item.index)
            rows.append(
                (
                    label,
                    str(item.dp_rank),
                    "-" if rate is None else f"{rate:.1f}",
                    "-" if item.highest_seq is None else str(item.highest_seq),
                    str(item.seq_gaps),
                    str(item.seq_resets + node.relaunches),
                    str(item.replay_batches),
                    health,
                )
            )
    return rows


def render_table(nodes: Sequence[NodeView], now: float | None = None) -> str:
    """The terminal view: a title line, then one aligned row per rank."""
    stamp = datetime.datetime.fromtimestamp(now or time.time()).strftime("%H:%M:%S")
    rows = [_COLUMNS, *_rows(nodes)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = [f"sglang-sidecar-overlay probe --watch  {stamp}  (Ctrl-C to stop)"]
    for node in nodes:
        if node.error is not None:
            lines.append(f"  {node.target}: {node.error}")
        elif node.incarnation:
            lines.append(
                f"  {node.target}: node_rank {node.node_rank}, launch {node.incarnation[:12]}"
            )
    for row in rows:
        lines.append(
            "  ".join(
                cell.rjust(width) if i > 1 else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
    lines += [f"  warning: {text}" for text in _horizon_warnings(nodes)]
    return "\n".join(lines) + "\n"


def _horizon_warnings(nodes: Sequence[NodeView]) -> list[str]:
    """One line per rank whose live gap exceeded its advertised replay horizon."""
    return [
        f"{node.target} rank {item.dp_rank}: {horizon_warning(item)}"
        for node in nodes
        for item in node.traffic
        if item.beyond_replay_horizon
    ]


def render_lines(nodes: Sequence[NodeView], now: float | None = None) -> str:
    """The non-terminal view: one ``key=value`` line per rank, stamped."""
    stamp = datetime.datetime.fromtimestamp(now or time.time()).strftime("%H:%M:%S")
    lines = []
    for node in nodes:
        if node.error is not None:
            lines.append(f"{stamp} {node.target} health=DOWN error={node.error!r}")
            continue
        if not node.traffic:
            lines.append(
                f"{stamp} {node.target} node_rank={node.node_rank} ranks=none "
                f"relaunches={node.relaunches} health={node.health}"
            )
        for item in node.traffic:
            rate = node.rates.get(item.index)
            lines.append(
                f"{stamp} {node.target} node_rank={node.node_rank} rank={item.dp_rank} "
                f"events_per_s={'-' if rate is None else f'{rate:.1f}'} "
                f"last_seq={'-' if item.highest_seq is None else item.highest_seq} "
                f"gaps={item.seq_gaps} resets={item.seq_resets + node.relaunches} "
                f"replayed={item.replay_batches} health={node.health}"
            )
    lines += [f"{stamp} warning: {text}" for text in _horizon_warnings(nodes)]
    return "\n".join(lines) + "\n"


@dataclasses.dataclass
class WatchReport(Report):
    """A finished watch: every node as the view last showed it. The watch observes, never
    judges: a clean stop is ok (exit 0), whatever the nodes did."""

    targets: list[str]
    seconds: float
    nodes: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return True

    def to_json(self) -> dict[str, Any]:
        """The stable ``probe --watch --json`` object (documented in the operator guide)."""
        return {
            "targets": self.targets,
            "ok": self.ok,
            "seconds": self.seconds,
            "nodes": self.nodes,
        }

    def render(self, out: TextIO) -> None:
        """Nothing more: the live view was drawn while the watch ran."""


def _draw(nodes: Sequence[NodeView], out: TextIO | None, in_place: bool, now: float) -> None:
    """One frame: redrawn in place on a terminal, appended as lines otherwise, or (no ``out``)
    only the rates brought up to date."""
    for node in nodes:
        node.update_rates(now)
    if out is None:
        return
    view = render_table(nodes) if in_place else render_lines(nodes)
    out.write((_HOME_CLEAR + view) if in_place else view)
    out.flush()


def _poll_until(nodes: Sequence[NodeView], wake: float) -> None:
    """Handle events until ``wake`` (monotonic), the wait shared among subscribed nodes."""
    wait = max(0.01, wake - time.monotonic())
    polled = [node for node in nodes if node.subscriptions is not None]
    if not polled:
        time.sleep(min(wait, 0.2))
    for node in polled:
        node.poll(wait / len(polled))


class _Stopped(Exception):
    """SIGTERM arrived: stop the watch as Ctrl-C does."""


def _raise_stopped(_signum: int, _frame: Any) -> None:
    raise _Stopped


@contextlib.contextmanager
def _sigterm_stops() -> Iterator[None]:
    """SIGTERM raises ``_Stopped`` while the watch runs (main thread only: Python handles
    signals there), the previous handler restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _watch_loop(
    nodes: Sequence[NodeView],
    out: TextIO | None,
    in_place: bool,
    duration: float | None,
    interval: float,
    refresh: float,
    timeout: float,
) -> None:
    """Refresh, draw and poll on their schedules until ``duration`` passes (None: forever)."""
    start = time.monotonic()
    next_refresh = next_render = start
    while True:
        now = time.monotonic()
        if duration is not None and now - start >= duration:
            return
        if now >= next_refresh:
            for node in nodes:
                node.refresh(timeout)
            next_refresh = time.monotonic() + refresh
        if now >= next_render:
            _draw(nodes, out, in_place, now)
            next_render += interval
        wake = min(next_render, next_refresh)
        if duration is not None:
            wake = min(wake, start + duration)
        _poll_until(nodes, wake)


def run_watch(
    targets: Sequence[str],
    out: TextIO | None,
    *,
    duration: float | None = None,
    interval: float = 1.0,
    refresh: float = 2.0,
    timeout: float = 2.0,
    tty: bool | None = None,
) -> WatchReport:
    """Watch until ``duration`` passes, Ctrl-C or SIGTERM (clean stops too); the view is drawn
    on ``out`` (None: not drawn), and the report holds the last figures."""
    from sglang_sidecar_overlay.tools.probe.group import target_is_local

    in_place = out is not None and (out.isatty() if tty is None else tty)
    nodes = [NodeView(target, dial_endpoints=target_is_local(target)) for target in targets]
    start = time.monotonic()
    if out is not None and in_place:
        out.write(_HIDE_CURSOR)
    try:
        with _sigterm_stops():
            _watch_loop(nodes, out, in_place, duration, interval, refresh, timeout)
    except (KeyboardInterrupt, _Stopped):
        pass
    finally:
        report = WatchReport(
            list(targets), round(time.monotonic() - start, 3), [node.to_json() for node in nodes]
        )
        for node in nodes:
            node.close()
        if out is not None:
            if in_place:
                out.write(_SHOW_CURSOR)
            out.flush()
    return report
