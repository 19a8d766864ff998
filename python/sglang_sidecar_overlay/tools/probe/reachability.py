"""Reachability findings: is anything listening where a node's sources say, and its health.

Run on the node (advertised endpoints are node-local): a publisher that connects instead of
binding, or one that exited, leaves nothing listening at its address, which is exactly what a
subscriber would dial.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Mapping
from typing import Any

from sglang_sidecar_overlay.contract.endpoints import endpoint_problems
from sglang_sidecar_overlay.tools.probe.report import (
    ERROR,
    OK,
    WARNING,
    CheckFindings,
    Finding,
    Health,
)

__all__ = ["check_listening", "endpoint_listening", "health_findings"]


def endpoint_listening(endpoint: str, timeout: float) -> str | None:
    """None when something accepts connections at ``endpoint``; else why not."""
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://") :].rpartition(":")
        host = host.strip("[]")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return None
        except OSError as exc:
            return exc.strerror or str(exc)
    if endpoint.startswith("ipc://"):
        return _ipc_listening(endpoint[len("ipc://") :], timeout)
    return "unsupported transport"


def _ipc_listening(path: str, timeout: float) -> str | None:
    if path.startswith("@"):
        path = "\0" + path[1:]
    elif not os.path.exists(path):
        return "no such socket file"
    elif not stat.S_ISSOCK(os.stat(path).st_mode):
        return "not a socket file"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def check_listening(info: Mapping[str, Any], timeout: float) -> list[Finding]:
    reachability = CheckFindings("reachability")
    sources = info.get("kv_event_sources")
    for index, source in enumerate(sources if isinstance(sources, list) else []):
        if not isinstance(source, dict):
            continue
        for key in ("endpoint", "replay_endpoint"):
            endpoint = source.get(key)
            if not isinstance(endpoint, str) or endpoint_problems(endpoint):
                continue
            problem = endpoint_listening(endpoint, timeout)
            if problem is not None:
                reachability.error(
                    ("kv_event_sources", index, key),
                    f"nothing accepts connections at {endpoint} ({problem}): a connect-style "
                    "publisher, a publisher that exited, or a probe run off the node",
                )
    return reachability.result()


_HEALTH = {
    "SERVING": (OK, "SERVING"),
    "absent": (OK, "no grpc.health.v1 service (not checked)"),
    "NOT_SERVING": (ERROR, "NOT_SERVING: the node's schedulers are not up"),
}


def health_findings(health: Health) -> list[Finding]:
    status = health["status"]
    detail = f" ({health['detail']})" if health.get("detail") else ""
    level, message = _HEALTH.get(status, (WARNING, f"{status}{detail}"))
    found = CheckFindings("health")
    found.add(level, None, message)
    return found.found
