"""Probe one node the way a KV-aware router does: fetch, validate, optionally listen.

``run_probe`` calls ``GetServerInfo`` on ``HOST:PORT``, checks the contract consumers rely on
(topology, every ``kv_event_sources`` entry, the ``dp_size`` pitfall), reads
``grpc.health.v1`` when the server offers it and, with a listen window, subscribes to every
advertised publisher, asks each replay endpoint for its history and reports what arrived.

Everything runs in the calling process and returns a ``ProbeReport``; the CLI renders it.
Expected failures (closed port, timeout, a server that is not SGLang) raise ``ProbeError``
with a one-line message; contract problems are ``Finding``s, never exceptions.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sglang_sidecar_overlay import _grpc_wire as wire

logger = logging.getLogger("sglang_sidecar_overlay.probe")

__all__ = [
    "Finding",
    "ProbeError",
    "ProbeReport",
    "RankTraffic",
    "check_endpoint",
    "check_server_info",
    "fetch_server_info",
    "listen",
    "parse_target",
    "read_health",
    "run_probe",
]

OK = "ok"
INFO = "info"
WARNING = "warning"
ERROR = "error"

DEFAULT_TIMEOUT = 5.0
# Server info carries every resolved server arg; be generous, it is read once.
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_CHANNEL_OPTIONS = (
    # An operator's http_proxy must not swallow a probe of a node-local port.
    ("grpc.enable_http_proxy", 0),
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
)
_WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "::", "[::]", ""})
_DISAGGREGATION_MODES = frozenset({"null", "agg", "aggregated", "prefill", "decode"})
_END_SEQ = -1
# Sequence numbers are 8-byte big-endian; the replay end marker is -1 as signed.
_SEQ_BYTES = 8


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

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


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
    stamped_ranks: set = dataclasses.field(default_factory=set)
    unstamped_batches: int = 0
    bad_messages: int = 0
    other_topics: int = 0
    last_bad: str | None = None
    _last_live_seq: int | None = None

    @property
    def rank_matches(self) -> bool | None:
        """True when every stamped batch carried the advertised rank; None before any stamp."""
        if not self.stamped_ranks:
            return None
        return self.stamped_ranks == {self.dp_rank}

    def to_json(self) -> dict:
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
            "stamped_ranks": sorted(self.stamped_ranks),
            "unstamped_batches": self.unstamped_batches,
            "rank_matches": self.rank_matches,
            "bad_messages": self.bad_messages,
        }


@dataclasses.dataclass
class ProbeReport:
    """Everything ``probe`` learned about one node."""

    target: str
    strict: bool = False
    error: ProbeError | None = None
    server_info: dict | None = None
    server_info_bytes: int = 0
    findings: list[Finding] = dataclasses.field(default_factory=list)
    health: dict | None = None
    listen_seconds: float | None = None
    traffic: list[RankTraffic] = dataclasses.field(default_factory=list)

    def count(self, level: str) -> int:
        return sum(1 for finding in self.findings if finding.level == level)

    @property
    def ok(self) -> bool:
        """Nothing wrong: no error, and no warning either when ``strict``."""
        if self.error is not None or self.count(ERROR):
            return False
        return not (self.strict and self.count(WARNING))

    def exit_code(self) -> int:
        """0 all good, 1 the node answered but something is wrong, 3 it could not be probed."""
        if self.error is not None:
            return 3
        return 0 if self.ok else 1

    def to_json(self) -> dict:
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
            "checks": [finding.to_json() for finding in self.findings],
            "errors": self.count(ERROR),
            "warnings": self.count(WARNING),
            "listen": (
                None
                if self.listen_seconds is None
                else {
                    "seconds": self.listen_seconds,
                    "ranks": [traffic.to_json() for traffic in self.traffic],
                }
            ),
        }

    def _summary(self) -> dict | None:
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
        )
        summary = {key: info.get(key) for key in keys}
        summary["bytes"] = self.server_info_bytes
        return summary


# --- target and RPCs ----------------------------------------------------------------------------


def parse_target(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[v6]:PORT`` or ``v6:PORT`` (last colon splits) → (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ProbeError("bad_target", f"{text!r}: expected [IPV6]:PORT")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ProbeError("bad_target", f"{text!r}: expected HOST:PORT")
    if not host:
        raise ProbeError("bad_target", f"{text!r}: the host is empty")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ProbeError("bad_target", f"{text!r}: port must be 1-65535")
    return host, int(port_text)


def grpc_target(host: str, port: int) -> str:
    """The address grpcio dials; IPv6 literals need brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _channel(target: str) -> Any:
    import grpc

    return grpc.insecure_channel(target, options=list(_CHANNEL_OPTIONS))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def fetch_server_info(target: str, timeout: float = DEFAULT_TIMEOUT) -> str:
    """The ``json_info`` text of ``GetServerInfo``; ``ProbeError`` with a one-line reason."""
    import grpc

    with _channel(target) as channel:
        call = channel.unary_unary(
            wire.GET_SERVER_INFO_PATH,
            request_serializer=lambda _request: wire.encode_get_server_info_request(),
            response_deserializer=lambda data: data,
        )
        try:
            raw = call(None, timeout=timeout)
        except grpc.RpcError as exc:
            raise _rpc_problem(target, exc, timeout) from None
    try:
        return wire.decode_get_server_info_response(raw)
    except wire.WireError as exc:
        raise ProbeError(
            "bad_response", f"{target}: GetServerInfo answer is not a GetServerInfoResponse: {exc}"
        ) from None


def _rpc_problem(target: str, exc: Any, timeout: float) -> ProbeError:
    import grpc

    code = exc.code()
    details = _one_line(exc.details() or "")
    if code == grpc.StatusCode.UNAVAILABLE:
        return ProbeError("unreachable", f"{target}: cannot connect ({details})")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ProbeError("timeout", f"{target}: no answer to GetServerInfo within {timeout:g}s")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return ProbeError(
            "not_sglang",
            f"{target}: not an SGLang native gRPC server "
            f"({wire.SGLANG_SERVICE}/GetServerInfo is UNIMPLEMENTED)",
        )
    return ProbeError("rpc_error", f"{target}: GetServerInfo failed: {code.name}: {details}")


def read_health(target: str, timeout: float = DEFAULT_TIMEOUT, service: str = "") -> dict:
    """``grpc.health.v1.Health/Check`` as ``{"service", "status", "detail"}`` (``absent``: none)."""
    import grpc

    with _channel(target) as channel:
        call = channel.unary_unary(
            wire.HEALTH_CHECK_PATH,
            request_serializer=wire.encode_health_check_request,
            response_deserializer=wire.decode_health_check_response,
        )
        try:
            status = call(service, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return {"service": service, "status": "absent", "detail": None}
            if code == grpc.StatusCode.NOT_FOUND:
                # The health service exists but does not know this service name.
                return {"service": service, "status": "SERVICE_UNKNOWN", "detail": None}
            return {"service": service, "status": "error", "detail": _one_line(exc.details())}
        except wire.WireError as exc:
            return {"service": service, "status": "error", "detail": str(exc)}
    return {"service": service, "status": wire.status_name(status), "detail": None}


# --- contract checks ----------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_server_info(text: str) -> tuple[dict | None, list[Finding]]:
    """Parse ``json_info`` and check what a router relies on; (info or None, findings)."""
    try:
        info = json.loads(text)
    except ValueError as exc:
        return None, [Finding(ERROR, "json", "json_info", f"not parsable JSON: {exc}")]
    if not isinstance(info, dict):
        kind = type(info).__name__
        return None, [Finding(ERROR, "json", "json_info", f"must be a JSON object, got {kind}")]
    findings = [Finding(OK, "json", "json_info", f"JSON object with {len(info)} keys")]
    findings += _check_topology(info)
    findings += _check_overlay_keys(info)
    findings += _check_sources(info)
    findings += _check_secrets(info)
    findings += _check_schema(info, findings)
    return info, findings


def _check_topology(info: Mapping[str, Any]) -> list[Finding]:
    found: list[Finding] = []
    nnodes = info.get("nnodes")
    node_rank = info.get("node_rank")
    if not _is_int(nnodes) or nnodes < 1:
        found.append(Finding(ERROR, "topology", "nnodes", f"must be an int ≥ 1, got {nnodes!r}"))
    if not _is_int(node_rank) or node_rank < 0:
        found.append(
            Finding(ERROR, "topology", "node_rank", f"must be an int ≥ 0, got {node_rank!r}")
        )
    elif _is_int(nnodes) and nnodes >= 1 and node_rank >= nnodes:
        found.append(
            Finding(ERROR, "topology", "node_rank", f"{node_rank} is not < nnodes {nnodes}")
        )
    addr = info.get("dist_init_addr")
    if _is_int(nnodes) and nnodes > 1 and (not isinstance(addr, str) or not addr.strip()):
        found.append(
            Finding(
                ERROR,
                "topology",
                "dist_init_addr",
                f"must be set when nnodes is {nnodes} (consumers group nodes by it), got {addr!r}",
            )
        )
    dp_size = info.get("dp_size")
    if not _is_int(dp_size) or dp_size < 1:
        found.append(Finding(ERROR, "topology", "dp_size", f"must be an int ≥ 1, got {dp_size!r}"))
    mode = info.get("disaggregation_mode")
    if mode is not None and mode not in _DISAGGREGATION_MODES:
        found.append(Finding(ERROR, "topology", "disaggregation_mode", f"unknown mode {mode!r}"))
    if not found:
        found.append(
            Finding(
                OK,
                "topology",
                None,
                f"node_rank={node_rank} nnodes={nnodes} dp_size={dp_size} dist_init_addr={addr!r}",
            )
        )
    return found


def _check_overlay_keys(info: Mapping[str, Any]) -> list[Finding]:
    """Keys every node running the overlay returns (stock SGLang lacks some of them)."""
    found: list[Finding] = []
    expected = (
        ("launch_command", (str, type(None)), "a string or null"),
        ("kv_events", (dict, type(None)), "an object or null"),
        ("kv_event_rank_space", (dict,), "an object"),
    )
    for key, types, described in expected:
        if key not in info:
            found.append(
                Finding(
                    ERROR,
                    "contract",
                    key,
                    "missing (required by the contract; is the overlay active on this node?)",
                )
            )
        elif not isinstance(info[key], types):
            found.append(Finding(ERROR, "contract", key, f"must be {described}, got {info[key]!r}"))
    return found


def _rank_space_size(info: Mapping[str, Any]) -> tuple[int | None, str]:
    """The width of the publisher-rank space and the field it came from."""
    space = info.get("kv_event_rank_space")
    if isinstance(space, Mapping) and _is_int(space.get("size")) and space["size"] > 0:
        return space["size"], "kv_event_rank_space.size"
    from sglang_sidecar_overlay.metadata import rank_space

    try:
        return rank_space(info, [])["size"], "dp_size/attn_dp_size/enable_dp_attention"
    except (ValueError, TypeError):
        pass
    legacy = info.get("kv_events")
    if isinstance(legacy, Mapping) and _is_int(legacy.get("dp_size")) and legacy["dp_size"] > 0:
        return legacy["dp_size"], "kv_events.dp_size"
    return None, ""


def _check_sources(info: Mapping[str, Any]) -> list[Finding]:
    if "kv_event_sources" not in info:
        return [
            Finding(
                ERROR,
                "kv_event_sources",
                "kv_event_sources",
                "missing: this SGLang does not advertise node-local publishers "
                "(the overlay is not active on this node)",
            )
        ]
    sources = info["kv_event_sources"]
    if not isinstance(sources, list):
        return [
            Finding(
                ERROR,
                "kv_event_sources",
                "kv_event_sources",
                f"must be a list (use [] for none), got {sources!r}",
            )
        ]
    found: list[Finding] = []
    found += _check_rank_space_object(info, sources)
    size, size_field = _rank_space_size(info)
    ranks_seen: dict[Any, int] = {}
    endpoints_seen: dict[str, str] = {}
    block_sizes: list[tuple[int, Any]] = []
    for index, source in enumerate(sources):
        prefix = f"kv_event_sources[{index}]"
        if not isinstance(source, dict):
            found.append(Finding(ERROR, "kv_event_sources", prefix, "must be an object"))
            continue
        found += _check_source_rank(info, source, prefix, size, size_field, ranks_seen)
        for key in ("endpoint", "replay_endpoint"):
            if key == "replay_endpoint" and source.get(key) is None:
                continue
            field = f"{prefix}.{key}"
            problems = check_endpoint(source.get(key))
            found += [Finding(ERROR, "kv_event_sources", field, text) for text in problems]
            endpoint = source.get(key)
            if not problems and isinstance(endpoint, str):
                other = endpoints_seen.get(endpoint)
                if other is not None:
                    found.append(
                        Finding(
                            ERROR,
                            "kv_event_sources",
                            field,
                            f"{endpoint} is also advertised by {other}",
                        )
                    )
                else:
                    endpoints_seen[endpoint] = field
        if not isinstance(source.get("topic"), str):
            found.append(
                Finding(
                    ERROR,
                    "kv_event_sources",
                    f"{prefix}.topic",
                    f"must be a string, got {source.get('topic')!r}",
                )
            )
        block_size = source.get("block_size")
        if not _is_int(block_size) or block_size <= 0:
            found.append(
                Finding(
                    ERROR,
                    "kv_event_sources",
                    f"{prefix}.block_size",
                    f"must be a positive int (page_size × dcp_size), got {block_size!r}",
                )
            )
        else:
            block_sizes.append((index, block_size))
    found += _check_block_sizes(info, block_sizes)
    ranks = [source.get("dp_rank") for source in sources if isinstance(source, dict)]
    if all(_is_int(rank) for rank in ranks) and ranks != sorted(ranks):
        found.append(
            Finding(
                ERROR, "kv_event_sources", "kv_event_sources", f"not sorted by dp_rank: {ranks}"
            )
        )
    if not any(finding.level == ERROR for finding in found):
        described = ", ".join(str(rank) for rank in ranks) or "none"
        found.insert(
            0,
            Finding(
                OK,
                "kv_event_sources",
                "kv_event_sources",
                f"{len(sources)} source(s), ranks {described}, rank space {size} ({size_field})",
            ),
        )
    return found


def _check_source_rank(
    info: Mapping[str, Any],
    source: Mapping[str, Any],
    prefix: str,
    size: int | None,
    size_field: str,
    ranks_seen: dict[Any, int],
) -> list[Finding]:
    field = f"{prefix}.dp_rank"
    rank = source.get("dp_rank")
    if not _is_int(rank) or rank < 0:
        return [Finding(ERROR, "kv_event_sources", field, f"must be an int ≥ 0, got {rank!r}")]
    found: list[Finding] = []
    if rank in ranks_seen:
        found.append(
            Finding(
                ERROR,
                "kv_event_sources",
                field,
                f"rank {rank} is also advertised by kv_event_sources[{ranks_seen[rank]}]",
            )
        )
    else:
        ranks_seen[rank] = int(prefix.split("[")[1].rstrip("]"))
    if size is None:
        found.append(
            Finding(
                WARNING,
                "kv_event_sources",
                field,
                "cannot tell the rank space (no kv_event_rank_space, dp_size or kv_events.dp_size)",
            )
        )
    elif rank >= size:
        found.append(
            Finding(
                ERROR,
                "kv_event_sources",
                field,
                f"rank {rank} is outside the publisher-rank space of size {size} ({size_field})",
            )
        )
    dp_size = info.get("dp_size")
    if _is_int(dp_size) and dp_size >= 1 and rank >= dp_size:
        # Released consumers (ai-dynamo ≤ 1.6.1) check dp_rank < dp_size and reject the node.
        found.append(
            Finding(
                WARNING,
                "kv_event_sources",
                field,
                f"rank {rank} ≥ top-level dp_size {dp_size}: a consumer validating against "
                "dp_size rejects this node; validate against kv_event_rank_space.size "
                "(or set SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE=1 on the node)",
            )
        )
    return found


def _check_rank_space_object(info: Mapping[str, Any], sources: list) -> list[Finding]:
    space = info.get("kv_event_rank_space")
    field = "kv_event_rank_space"
    if not isinstance(space, dict):
        # Reported by _check_overlay_keys.
        return []
    found: list[Finding] = []
    widths = {key: space.get(key) for key in ("size", "system_dp_size", "attn_dp_size")}
    bad = [key for key, value in widths.items() if not _is_int(value) or value < 1]
    if bad:
        found.append(
            Finding(ERROR, "kv_event_sources", field, f"{', '.join(bad)} must be ints ≥ 1")
        )
    elif widths["size"] != widths["system_dp_size"] * widths["attn_dp_size"]:
        found.append(
            Finding(
                ERROR,
                "kv_event_sources",
                f"{field}.size",
                f"{widths['size']} ≠ system_dp_size {widths['system_dp_size']} × "
                f"attn_dp_size {widths['attn_dp_size']}",
            )
        )
    local = space.get("local_ranks")
    advertised = sorted(
        {s.get("dp_rank") for s in sources if isinstance(s, dict) and _is_int(s.get("dp_rank"))}
    )
    if not isinstance(local, list) or sorted(local) != advertised:
        found.append(
            Finding(
                ERROR,
                "kv_event_sources",
                f"{field}.local_ranks",
                f"{local!r} does not match the advertised ranks {advertised}",
            )
        )
    return found


def _check_block_sizes(
    info: Mapping[str, Any], block_sizes: list[tuple[int, int]]
) -> list[Finding]:
    if not block_sizes:
        return []
    found: list[Finding] = []
    first_index, first = block_sizes[0]
    for index, size in block_sizes[1:]:
        if size != first:
            found.append(
                Finding(
                    ERROR,
                    "kv_event_sources",
                    f"kv_event_sources[{index}].block_size",
                    f"{size} differs from kv_event_sources[{first_index}].block_size {first} "
                    "(a router hashes every rank with one block size)",
                )
            )
    legacy = info.get("kv_events")
    if isinstance(legacy, Mapping) and "block_size" in legacy:
        legacy_size = legacy["block_size"]
        if legacy_size != first:
            found.append(
                Finding(
                    ERROR,
                    "kv_event_sources",
                    "kv_events.block_size",
                    f"{legacy_size!r} differs from kv_event_sources block_size {first}",
                )
            )
    return found


def _check_secrets(info: Mapping[str, Any]) -> list[Finding]:
    from sglang_sidecar_overlay.metadata import REDACTED, is_secret_name

    found: list[Finding] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                field = f"{path}.{key}" if path else str(key)
                if is_secret_name(str(key)) and item not in (None, REDACTED, ""):
                    found.append(
                        Finding(ERROR, "secrets", field, "holds a value; secrets must be redacted")
                    )
                else:
                    walk(item, field)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]")

    walk(info, "")
    return found


def _check_schema(info: Mapping[str, Any], earlier: Sequence[Finding]) -> list[Finding]:
    """JSON Schema validation when jsonschema is importable; silent otherwise."""
    try:
        import jsonschema

        from sglang_sidecar_overlay.metadata import load_schema

        schema = load_schema()
    except (ImportError, OSError, ValueError):
        return []
    flagged = {finding.field for finding in earlier if finding.level == ERROR}
    found: list[Finding] = []
    validator = jsonschema.Draft202012Validator(schema)
    for problem in validator.iter_errors(info):
        field = _json_path(problem.absolute_path) or "json_info"
        # Own checks already name these fields with a better message.
        if any(
            seen and (field == seen or field.startswith(f"{seen}.") or field.startswith(f"{seen}["))
            for seen in flagged
        ):
            continue
        found.append(Finding(ERROR, "schema", field, _one_line(problem.message)))
    return found


def _json_path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def check_endpoint(endpoint: Any) -> list[str]:
    """Problems of an advertised endpoint as a consumer dials it (empty list: fine)."""
    if not isinstance(endpoint, str) or not endpoint:
        return [f"must be a non-empty string, got {endpoint!r}"]
    if endpoint.startswith("inproc://"):
        return [f"{endpoint} is process-local (inproc); no other process can subscribe"]
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        if path.startswith("@") and len(path) > 1:
            return []
        if not path.startswith("/"):
            return [f"{endpoint}: ipc path must be absolute (or an @abstract name)"]
        return []
    if not endpoint.startswith("tcp://"):
        return [f"{endpoint}: unsupported transport; expected tcp:// or ipc://"]
    address = endpoint[len("tcp://") :]
    if any(mark in address for mark in "@/?#;"):
        return [f"{endpoint}: must be tcp://HOST:PORT (no user, path, query or source address)"]
    if address.startswith("["):
        host, sep, rest = address.partition("]")
        host += sep
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = address.rpartition(":")
        if ":" in host:
            return [f"{endpoint}: an IPv6 host must be bracketed, tcp://[ADDR]:PORT"]
    if host in _WILDCARD_HOSTS:
        return [
            f"{endpoint}: wildcard bind address, not dialable; "
            "advertise the bound address (127.0.0.1 / [::1] for wildcard binds)"
        ]
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return [f"{endpoint}: port must be 1-65535"]
    return []


def endpoint_listening(endpoint: str, timeout: float) -> str | None:
    """None when something accepts connections at ``endpoint``; else why not.

    A publisher that connects instead of binding leaves nothing listening at its address,
    which is exactly what a subscriber would dial.
    """
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://") :].rpartition(":")
        host = host.strip("[]")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return None
        except OSError as exc:
            return exc.strerror or str(exc)
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
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
    return "unsupported transport"


def _check_listening(info: Mapping[str, Any], timeout: float) -> list[Finding]:
    found: list[Finding] = []
    sources = info.get("kv_event_sources")
    if not isinstance(sources, list):
        return found
    for index, source in enumerate(sources):
        if not isinstance(source, dict):
            continue
        for key in ("endpoint", "replay_endpoint"):
            endpoint = source.get(key)
            if not isinstance(endpoint, str) or check_endpoint(endpoint):
                continue
            problem = endpoint_listening(endpoint, timeout)
            if problem is not None:
                found.append(
                    Finding(
                        ERROR,
                        "reachability",
                        f"kv_event_sources[{index}].{key}",
                        f"nothing accepts connections at {endpoint} ({problem}): a connect-style "
                        "publisher, a publisher that exited, or a probe run off the node",
                    )
                )
    return found


def _health_findings(health: dict) -> list[Finding]:
    status = health["status"]
    if status == "SERVING":
        return [Finding(OK, "health", None, "SERVING")]
    if status == "absent":
        return [Finding(OK, "health", None, "no grpc.health.v1 service (not checked)")]
    if status == "NOT_SERVING":
        return [Finding(ERROR, "health", None, "NOT_SERVING: the node's schedulers are not up")]
    detail = f" ({health['detail']})" if health.get("detail") else ""
    return [Finding(WARNING, "health", None, f"{status}{detail}")]


# --- listening ----------------------------------------------------------------------------------


def _decode_seq(raw: bytes) -> int | None:
    if len(raw) != _SEQ_BYTES:
        return None
    return int.from_bytes(raw, "big", signed=True)


def _reject(traffic: RankTraffic, reason: str) -> None:
    """Count a message that does not follow SGLang's wire format, keeping the latest reason."""
    traffic.bad_messages += 1
    traffic.last_bad = reason


def _record_batch(traffic: RankTraffic, seq: int, payload: bytes, *, replay: bool) -> None:
    import msgspec

    try:
        batch = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        _reject(traffic, f"payload is not msgpack: {exc}")
        return
    # EventBatch is array-like: [ts, events, rank?]; the rank is omitted when unset.
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        _reject(traffic, "payload is not an event batch [ts, events, rank]")
        return
    events = len(batch[1])
    if replay:
        traffic.replay_batches += 1
        traffic.replay_events += events
    else:
        traffic.batches += 1
        traffic.events += events
        if traffic._last_live_seq is not None and seq != traffic._last_live_seq + 1:
            traffic.seq_gaps += 1
        traffic._last_live_seq = seq
    if traffic.highest_seq is None or seq > traffic.highest_seq:
        traffic.highest_seq = seq
    stamp = batch[2] if len(batch) > 2 else None
    if stamp is None:
        traffic.unstamped_batches += 1
    else:
        traffic.stamped_ranks.add(stamp)


def _on_live(traffic: RankTraffic, frames: list[bytes]) -> None:
    if len(frames) != 3:
        _reject(traffic, f"live message has {len(frames)} frames, expected 3")
        return
    topic, seq_raw, payload = frames
    if topic != traffic.topic.encode("utf-8"):
        # SUB filters by prefix; a longer topic sharing the prefix is someone else's.
        traffic.other_topics += 1
        return
    seq = _decode_seq(seq_raw)
    if seq is None:
        _reject(traffic, "sequence frame is not 8 bytes")
        return
    _record_batch(traffic, seq, payload, replay=False)


def _on_replay(traffic: RankTraffic, frames: list[bytes]) -> None:
    # DEALER sees the ROUTER's empty delimiter, then (seq, payload) before SGLang 0.5.22 or
    # (topic, seq, payload) from 0.5.22 on; seq -1 ends the replay.
    if frames and frames[0] == b"":
        frames = frames[1:]
    if len(frames) == 3:
        seq_raw, payload = frames[1], frames[2]
    elif len(frames) == 2:
        seq_raw, payload = frames
    else:
        _reject(traffic, f"replay message has {len(frames)} frames")
        return
    seq = _decode_seq(seq_raw)
    if seq is None:
        _reject(traffic, "replay sequence frame is not 8 bytes")
        return
    if seq == _END_SEQ:
        traffic.replay = "complete"
        return
    _record_batch(traffic, seq, payload, replay=True)


def listen(
    sources: Sequence[Mapping[str, Any]],
    seconds: float,
    *,
    until: Callable[[list[RankTraffic]], bool] | None = None,
) -> list[RankTraffic]:
    """Subscribe to every source (and request replay from 0) for ``seconds``.

    ``until`` may end the window early once it returns True (the selftest uses it so it
    does not wait out a fixed window once everything it needs has arrived).
    """
    import zmq

    traffic = [
        RankTraffic(
            index=index,
            dp_rank=source.get("dp_rank"),
            endpoint=str(source.get("endpoint")),
            topic=str(source.get("topic") or ""),
            replay_endpoint=source.get("replay_endpoint"),
        )
        for index, source in enumerate(sources)
    ]
    context = zmq.Context()
    sockets: list[Any] = []
    handlers: dict[Any, tuple[RankTraffic, Callable[[RankTraffic, list[bytes]], None]]] = {}
    poller = zmq.Poller()
    try:
        for item in traffic:
            sub = context.socket(zmq.SUB)
            sockets.append(sub)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, item.topic.encode("utf-8"))
            try:
                sub.connect(item.endpoint)
            except zmq.ZMQError as exc:
                _reject(item, f"cannot subscribe to {item.endpoint}: {exc}")
                continue
            poller.register(sub, zmq.POLLIN)
            handlers[sub] = (item, _on_live)
            if item.replay_endpoint:
                dealer = context.socket(zmq.DEALER)
                sockets.append(dealer)
                dealer.setsockopt(zmq.LINGER, 0)
                try:
                    dealer.connect(item.replay_endpoint)
                except zmq.ZMQError as exc:
                    _reject(item, f"cannot connect to {item.replay_endpoint}: {exc}")
                    continue
                # The ROUTER expects [identity, "", start_seq]; DEALER adds no delimiter.
                dealer.send_multipart([b"", (0).to_bytes(_SEQ_BYTES, "big")])
                item.replay = "requested"
                poller.register(dealer, zmq.POLLIN)
                handlers[dealer] = (item, _on_replay)
        deadline = time.monotonic() + max(0.0, seconds)
        # Nothing to poll: an empty poller returns at once and would spin until the deadline.
        while handlers:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (until is not None and until(traffic)):
                break
            for sock, _event in poller.poll(timeout=min(remaining, 0.1) * 1000):
                item, handler = handlers[sock]
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    handler(item, frames)
    finally:
        for sock in sockets:
            sock.close(linger=0)
        context.term()
    return traffic


def _traffic_findings(traffic: Sequence[RankTraffic], seconds: float) -> list[Finding]:
    found: list[Finding] = []
    for item in traffic:
        name = f"rank {item.dp_rank}"
        prefix = f"kv_event_sources[{item.index}]"
        summary = (
            f"{item.batches} batches / {item.events} events live, "
            f"{item.replay_batches} batches / {item.replay_events} events replayed, "
            f"highest seq {item.highest_seq if item.highest_seq is not None else '-'}"
        )
        problems: list[Finding] = []
        if item.rank_matches is False:
            stamped = sorted(item.stamped_ranks)
            problems.append(
                Finding(
                    ERROR,
                    name,
                    f"{prefix}.dp_rank",
                    f"batches are stamped with rank(s) {stamped}, advertised {item.dp_rank}",
                )
            )
        if item.bad_messages:
            problems.append(
                Finding(
                    ERROR,
                    name,
                    f"{prefix}.endpoint",
                    f"{item.bad_messages} undecodable message(s): {item.last_bad}",
                )
            )
        if item.replay == "requested":
            problems.append(
                Finding(
                    ERROR,
                    name,
                    f"{prefix}.replay_endpoint",
                    f"no complete replay from {item.replay_endpoint} within {seconds:g}s",
                )
            )
        if item.batches + item.replay_batches == 0:
            problems.append(
                Finding(WARNING, name, prefix, f"no events within {seconds:g}s (idle publisher?)")
            )
        if item.unstamped_batches:
            problems.append(
                Finding(
                    WARNING,
                    name,
                    f"{prefix}.dp_rank",
                    f"{item.unstamped_batches} batch(es) carry no rank stamp",
                )
            )
        if item.seq_gaps:
            problems.append(
                Finding(WARNING, name, prefix, f"{item.seq_gaps} gap(s) in live sequence numbers")
            )
        # The summary line names the rank, not a field: problems below carry the fields.
        if not problems:
            stamp = "stamped rank matches" if item.rank_matches else "no rank stamp seen"
            found.append(Finding(OK, name, None, f"{summary}, {stamp}"))
        else:
            found.append(Finding(INFO, name, None, summary))
            found += problems
    return found


# --- the whole probe ----------------------------------------------------------------------------


def _dialable_sources(sources: Any) -> list[dict]:
    """Entries worth subscribing to; a replay endpoint already reported as broken is dropped."""
    dialable: list[dict] = []
    for source in sources if isinstance(sources, list) else []:
        if not isinstance(source, dict) or check_endpoint(source.get("endpoint")):
            continue
        entry = dict(source)
        if entry.get("replay_endpoint") is not None and check_endpoint(entry["replay_endpoint"]):
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
        report.findings += _check_listening(info, min(timeout, 2.0))
    report.health = read_health(address, timeout)
    report.findings += _health_findings(report.health)
    if listen_seconds is not None and info is not None:
        sources = _dialable_sources(info.get("kv_event_sources"))
        report.listen_seconds = listen_seconds
        report.traffic = listen(sources, listen_seconds, until=until)
        report.findings += _traffic_findings(report.traffic, listen_seconds)
    return report
