"""Probe one node the way a KV-aware router does: fetch, validate, optionally listen.

``run_probe`` calls ``GetServerInfo`` on ``HOST:PORT`` (``rpc``), checks the contract consumers
rely on (``shapes`` by the schema, then ``checks``), dials the advertised endpoints and reads
``grpc.health.v1`` when the server offers it (``reachability``) and, with a listen window,
subscribes to every advertised publisher and asks each replay endpoint for its
history (``listen``). Everything runs in the calling process and returns a ``ProbeReport``
(``report``); what each released consumer would register for this node is judged by
``consumers``. The CLI renders the report. Expected failures (closed port, timeout, a server that is
not SGLang) are a ``ProbeError`` with a one-line message; contract problems are ``Finding``s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sglang_sidecar_overlay.contract.endpoints import endpoint_problems
from sglang_sidecar_overlay.tools.probe.checks import check_server_info
from sglang_sidecar_overlay.tools.probe.consumers import consumer_findings, node_verdicts, select
from sglang_sidecar_overlay.tools.probe.listen import listen, traffic_findings
from sglang_sidecar_overlay.tools.probe.reachability import check_listening, health_findings
from sglang_sidecar_overlay.tools.probe.report import (
    ERROR,
    INFO,
    OK,
    WARNING,
    Finding,
    ProbeError,
    ProbeReport,
    RankTraffic,
)
from sglang_sidecar_overlay.tools.probe.rpc import (
    DEFAULT_TIMEOUT,
    fetch_server_info,
    grpc_target,
    parse_target,
    read_health,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "ERROR",
    "INFO",
    "OK",
    "WARNING",
    "Finding",
    "ProbeError",
    "ProbeReport",
    "RankTraffic",
    "check_server_info",
    "fetch_server_info",
    "grpc_target",
    "listen",
    "node_local",
    "parse_target",
    "read_health",
    "run_probe",
]


def _dialable_sources(sources: Any) -> list[dict[str, Any]]:
    """Entries worth subscribing to; a replay endpoint already reported as broken is dropped."""
    dialable: list[dict[str, Any]] = []
    for source in sources if isinstance(sources, list) else []:
        if not isinstance(source, dict) or endpoint_problems(source.get("endpoint")):
            continue
        entry = dict(source)
        if entry.get("replay_endpoint") is not None and endpoint_problems(entry["replay_endpoint"]):
            entry["replay_endpoint"] = None
        dialable.append(entry)
    return dialable


def node_local(endpoint: Any) -> bool:
    """Whether ``endpoint`` can be dialled only on its node (loopback TCP or ``ipc://``)."""
    if not isinstance(endpoint, str):
        return False
    if endpoint.startswith("ipc://"):
        return True
    host = endpoint[len("tcp://") :].rpartition(":")[0].strip("[]")
    return host == "localhost" or host.startswith("127.") or host == "::1"


def _remote_view(info: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """``info`` with node-local endpoints blanked (indices kept), and how many were blanked."""
    sources = info.get("kv_event_sources")
    if not isinstance(sources, list):
        return info, 0
    view: list[Any] = []
    skipped = 0
    for source in sources:
        if isinstance(source, dict):
            source = dict(source)
            for key in ("endpoint", "replay_endpoint"):
                if node_local(source.get(key)):
                    source[key] = None
                    skipped += 1
        view.append(source)
    return {**info, "kv_event_sources": view}, skipped


def run_probe(
    target: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    listen_seconds: float | None = None,
    strict: bool = False,
    until: Callable[[list[RankTraffic]], bool] | None = None,
    dial_endpoints: bool = True,
    consumers: Sequence[str] | None = None,
) -> ProbeReport:
    """Probe ``target`` (HOST:PORT); never raises for expected failures.

    ``dial_endpoints=False`` (the probe runs off the node): node-local endpoints (loopback,
    ``ipc://``) are checked for shape but neither dialled nor listened to. ``consumers``
    (``--consumer`` names) judge the probe; None: those the node's ``sidecar`` runs, if any.
    """
    report = ProbeReport(target=target, strict=strict)
    try:
        host, port = parse_target(target)
        address = grpc_target(host, port)
        text = fetch_server_info(address, timeout)
    except ProbeError as exc:
        report.error = exc
        return report
    report.server_info_bytes = len(text.encode("utf-8"))
    info, findings = check_server_info(text)
    report.server_info = info
    report.findings = findings
    if info is not None:
        selection = select(consumers, [info])
        report.consumers = node_verdicts(info)
        report.consumers_selected = selection.names
        report.findings += consumer_findings(report.consumers, selection)
    reachable = info
    if info is not None and not dial_endpoints:
        reachable, skipped = _remote_view(info)
        if skipped:
            report.findings.append(
                Finding(
                    INFO,
                    "reachability",
                    None,
                    f"{skipped} node-local endpoint(s) not dialled: the probe runs off this node",
                )
            )
    if reachable is not None:
        report.findings += check_listening(reachable, min(timeout, 2.0))
    report.health = read_health(address, timeout)
    report.findings += health_findings(report.health)
    if listen_seconds is not None and reachable is not None:
        sources = _dialable_sources(reachable.get("kv_event_sources"))
        report.listen_seconds = listen_seconds
        report.traffic = listen(sources, listen_seconds, until=until)
        report.findings += traffic_findings(report.traffic, listen_seconds)
    return report
