"""Probe one node the way a KV-aware router does: fetch, validate, optionally listen.

``run_probe`` calls ``GetServerInfo`` on ``HOST:PORT`` (``rpc``), checks the contract consumers
rely on (``checks``), reads ``grpc.health.v1`` when the server offers it and, with a listen
window, subscribes to every advertised publisher and asks each replay endpoint for its
history (``listen``). Everything runs in the calling process and returns a ``ProbeReport``
(``report``); the CLI renders it. Expected failures (closed port, timeout, a server that is
not SGLang) are a ``ProbeError`` with a one-line message; contract problems are ``Finding``s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_sidecar_overlay.contract.endpoints import endpoint_problems
from sglang_sidecar_overlay.tools.probe.checks import (
    check_listening,
    check_server_info,
    health_findings,
)
from sglang_sidecar_overlay.tools.probe.listen import listen, traffic_findings
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
    "listen",
    "parse_target",
    "read_health",
    "run_probe",
]


def _dialable_sources(sources: Any) -> list[dict]:
    """Entries worth subscribing to; a replay endpoint already reported as broken is dropped."""
    dialable: list[dict] = []
    for source in sources if isinstance(sources, list) else []:
        if not isinstance(source, dict) or endpoint_problems(source.get("endpoint")):
            continue
        entry = dict(source)
        if entry.get("replay_endpoint") is not None and endpoint_problems(entry["replay_endpoint"]):
            entry["replay_endpoint"] = None
        dialable.append(entry)
    return dialable


def run_probe(
    target: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    listen_seconds: float | None = None,
    strict: bool = False,
    until: Callable[[list[RankTraffic]], bool] | None = None,
) -> ProbeReport:
    """Probe ``target`` (HOST:PORT); never raises for expected failures."""
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
        report.findings += check_listening(info, min(timeout, 2.0))
    report.health = read_health(address, timeout)
    report.findings += health_findings(report.health)
    if listen_seconds is not None and info is not None:
        sources = _dialable_sources(info.get("kv_event_sources"))
        report.listen_seconds = listen_seconds
        report.traffic = listen(sources, listen_seconds, until=until)
        report.findings += traffic_findings(report.traffic, listen_seconds)
    return report
