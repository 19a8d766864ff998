"""The contract checks a router relies on, run on one node's ``json_info``.

Shapes (types, required keys, patterns, enums, the endpoint grammar) are checked by the
packaged JSON Schema alone (``contract.schema.contract_validator``); each schema error becomes
one finding naming the JSON path and the bad value. The rules here are the ones a schema
cannot say: ``node_rank`` < ``nnodes``, ranks inside the rank space and unique, ``local_ranks``
equal to the advertised ranks, the rank space's size, equal block sizes, sorted sources, unique
endpoints, the ``dp_size`` pitfall, secrets anywhere by the redaction rule, and live listeners.
They run only on fields the schema passed. Problems are ``Finding``s, never exceptions.
"""

from __future__ import annotations

import datetime
import json
import os
import reprlib
import socket
import stat
import time
from collections.abc import Mapping
from typing import Any

from sglang_sidecar_overlay.contract.endpoints import endpoint_problems
from sglang_sidecar_overlay.contract.incarnation import CONTRACT_VERSION
from sglang_sidecar_overlay.contract.redaction import REDACTED, is_secret_name, redact_text
from sglang_sidecar_overlay.contract.schema import ENDPOINT_FORMAT, contract_validator
from sglang_sidecar_overlay.contract.server_info import rank_space
from sglang_sidecar_overlay.contract.sources import DEFAULT_ENCODING
from sglang_sidecar_overlay.contract.values import is_int
from sglang_sidecar_overlay.tools.probe.report import ERROR, OK, WARNING, Finding
from sglang_sidecar_overlay.tools.probe.rpc import one_line

__all__ = [
    "check_listening",
    "check_server_info",
    "describe_incarnation",
    "endpoint_listening",
    "health_findings",
]

# Deepest object/array nesting the checks walk; real server info is under 10 levels.
MAX_NESTING = 64
# Batch encodings ``probe --listen`` decodes.
_DECODABLE_ENCODINGS = frozenset({DEFAULT_ENCODING})
# What contract version 2 added; a node without contract_version lacks them all and is
# reported once, under contract_version.
_VERSION_2_KEYS = frozenset({"incarnation", "encoding"})
# The report's check name for a finding, by the top-level key it concerns.
_CHECK_OF_KEY = {
    **dict.fromkeys(
        ("node_rank", "nnodes", "dp_size", "dist_init_addr", "disaggregation_mode"), "topology"
    ),
    **dict.fromkeys(("launch_command", "kv_events", "contract_version", "incarnation"), "contract"),
    **dict.fromkeys(("kv_event_sources", "kv_event_rank_space"), "kv_event_sources"),
}
_TOPOLOGY_FIELDS = frozenset(key for key, check in _CHECK_OF_KEY.items() if check == "topology")
_OVERLAY_HINT = "missing (required by the contract; is the overlay active on this node?)"
# What a missing top-level key most likely means.
_MISSING = {
    "launch_command": _OVERLAY_HINT,
    "kv_events": _OVERLAY_HINT,
    "kv_event_rank_space": _OVERLAY_HINT,
    "kv_event_sources": "missing: this SGLang does not advertise node-local publishers "
    "(the overlay is not active on this node)",
    "contract_version": "missing: the node serves contract version 1 (no incarnation, no "
    "source encoding), so consumers cannot tell a relaunch from a network blip",
}
_TYPE_NAMES = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "an int",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
}
# Bad values are shown, never in full: a hostile reply can hold megabytes in one field.
_SHORT = reprlib.Repr()
_SHORT.maxstring = 80
_SHORT.maxother = 80
_SHORT.maxlong = 40
_SHORT.maxlist = _SHORT.maxtuple = 6
_SHORT.maxdict = 4
_SHORT.maxlevel = 2


def _nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether objects/arrays nest deeper than ``limit`` (iterative: any depth is safe)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def check_server_info(text: str) -> tuple[dict | None, list[Finding]]:
    """Parse ``json_info`` and check what a router relies on; (info or None, findings)."""
    try:
        info = json.loads(text)
    except ValueError as exc:
        return None, [Finding(ERROR, "json", "json_info", f"not parsable JSON: {exc}")]
    except RecursionError:
        message = f"nests deeper than {MAX_NESTING} levels (too deep to parse)"
        return None, [Finding(ERROR, "json", "json_info", message)]
    if not isinstance(info, dict):
        kind = type(info).__name__
        return None, [Finding(ERROR, "json", "json_info", f"must be a JSON object, got {kind}")]
    if _nesting_exceeds(info, MAX_NESTING):
        # Server info is a few levels deep; deeper input is hostile and every later walk
        # (schema, checks, --json output) would recurse into it.
        message = f"nests deeper than {MAX_NESTING} levels"
        return None, [Finding(ERROR, "json", "json_info", message)]
    findings = [Finding(OK, "json", "json_info", f"JSON object with {len(info)} keys")]
    shape = _check_schema(info)
    # Cross-field rules run only on fields whose shape is right.
    flagged = {finding.field or "" for finding in shape}
    findings += shape
    findings += _check_topology(info, flagged)
    findings += _check_launch(info, flagged)
    findings += _check_sources(info, flagged)
    findings += _check_secrets(info)
    return info, findings


# --- shapes: the schema ------------------------------------------------------------------------


def _check_schema(info: Mapping[str, Any]) -> list[Finding]:
    """Schema errors as findings naming the JSON path and the bad value, one per field.

    The first error of a field is the one kept: ``type`` comes before the keywords that
    refine it (``minimum``, ``enum``), so a field of the wrong type is not also out of range.
    """
    try:
        validator = contract_validator()
    except ImportError as exc:
        message = f"cannot check shapes: {exc} (install jsonschema, a dependency of this package)"
        return [Finding(ERROR, "schema", "json_info", message)]
    contract_1 = "contract_version" not in info
    found: list[Finding] = []
    seen: set[str] = set()
    for error in validator.iter_errors(info):
        for finding in _describe(error, contract_1):
            if finding.field not in seen:
                seen.add(finding.field or "")
                found.append(finding)
    return found


def _describe(error: Any, contract_1: bool) -> list[Finding]:
    """The findings one ``jsonschema`` error stands for (a ``required`` error may name several)."""
    path = _json_path(error.absolute_path)
    value = error.instance
    kind = error.validator
    if kind == "required":
        missing = [key for key in error.validator_value if key not in value]
        return [
            Finding(
                ERROR,
                _check_of(_join(path, key)),
                _join(path, key),
                (_MISSING.get(key) if not path else None) or "missing (required by the contract)",
            )
            for key in missing
            if not (contract_1 and key in _VERSION_2_KEYS)
        ]
    field = path or "json_info"
    if "patternProperties" in error.absolute_schema_path:
        # A secret-named key: never echo its value.
        return [Finding(ERROR, "secrets", field, "holds a value; secrets must be redacted")]
    return [Finding(ERROR, _check_of(field), field, redact_text(one_line(_message(error))))]


def _message(error: Any) -> str:
    value = error.instance
    kind = error.validator
    expected = error.validator_value
    shown = _SHORT.repr(value)
    if kind == "type":
        names = [expected] if isinstance(expected, str) else list(expected)
        described = " or ".join(_TYPE_NAMES.get(name, name) for name in names)
        return f"must be {described}, got {shown}"
    if kind == "minimum":
        return f"must be ≥ {expected}, got {shown}"
    if kind == "exclusiveMinimum":
        return f"must be > {expected}, got {shown}"
    if kind == "enum":
        choices = ", ".join(repr(choice) for choice in expected)
        return f"unknown value {shown}, expected one of {choices}"
    if kind == "minLength" and expected == 1:
        return f"must not be empty, got {shown}"
    if kind == "pattern":
        return f"{shown} does not match {expected}"
    if kind == "uniqueItems":
        return f"has repeated items: {shown}"
    if kind == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(str(key) for key in value if key not in allowed)
        return f"unexpected key(s) {_SHORT.repr(extra)}; allowed: {', '.join(sorted(allowed))}"
    if (kind == "format" and expected == ENDPOINT_FORMAT) or (
        kind == "anyOf" and error.schema.get("format") == ENDPOINT_FORMAT
    ):
        # The one endpoint grammar says why, naming the endpoint.
        problems = endpoint_problems(value)
        return _clip(problems[0]) if problems else f"{shown} is not dialable"
    if kind == "anyOf":
        return f"{shown} matches none of the allowed forms"
    return f"{shown}: {_clip(error.message)}"


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit]}…"


def _check_of(field: str) -> str:
    top = field.split(".", 1)[0].split("[", 1)[0]
    return _CHECK_OF_KEY.get(top, "schema")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _json_path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _flagged_under(flagged: set[str], field: str) -> bool:
    """Whether the schema flagged ``field`` or anything inside it."""
    return any(seen == field or seen.startswith((f"{field}.", f"{field}[")) for seen in flagged)


# --- cross-field rules -------------------------------------------------------------------------


def _check_topology(info: Mapping[str, Any], flagged: set[str]) -> list[Finding]:
    found: list[Finding] = []
    nnodes = info.get("nnodes")
    node_rank = info.get("node_rank")
    shapes_ok = not ({"nnodes", "node_rank"} & flagged)
    if shapes_ok and is_int(nnodes) and is_int(node_rank) and node_rank >= nnodes:
        found.append(
            Finding(ERROR, "topology", "node_rank", f"{node_rank} is not < nnodes {nnodes}")
        )
    addr = info.get("dist_init_addr")
    if (
        "dist_init_addr" not in flagged
        and "nnodes" not in flagged
        and is_int(nnodes)
        and nnodes > 1
        and (not isinstance(addr, str) or not addr.strip())
    ):
        found.append(
            Finding(
                ERROR,
                "topology",
                "dist_init_addr",
                f"must be set when nnodes is {nnodes} (consumers group nodes by it), got {addr!r}",
            )
        )
    if not found and not (_TOPOLOGY_FIELDS & flagged):
        dp_size = info.get("dp_size")
        found.append(
            Finding(
                OK,
                "topology",
                None,
                f"node_rank={node_rank} nnodes={nnodes} dp_size={dp_size} dist_init_addr={addr!r}",
            )
        )
    return found


def _check_launch(info: Mapping[str, Any], flagged: set[str]) -> list[Finding]:
    """``contract_version`` and ``incarnation``: which contract, and which launch of the node."""
    version = info.get("contract_version")
    if "contract_version" in flagged or not is_int(version):
        return []
    if version > CONTRACT_VERSION:
        return [
            Finding(
                WARNING,
                "contract",
                "contract_version",
                f"{version} is newer than this probe knows ({CONTRACT_VERSION}): "
                "checks may be incomplete",
            )
        ]
    if _flagged_under(flagged, "incarnation"):
        return []
    return [Finding(OK, "contract", "incarnation", f"v{version}, {describe_incarnation(info)}")]


def describe_incarnation(info: Mapping[str, Any], now: float | None = None) -> str:
    """``id … started <UTC time> (up …)`` for a node's valid incarnation."""
    launch = info["incarnation"]
    started = float(launch["started_at"])
    try:
        when = datetime.datetime.fromtimestamp(started, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        # Valid by the schema (seconds > 0) but past what a calendar date can hold.
        return f"launch {launch['id']} started at {_SHORT.repr(launch['started_at'])} s"
    up = max(0.0, (time.time() if now is None else now) - started)
    return (
        f"launch {launch['id']} started {when.strftime('%Y-%m-%dT%H:%M:%SZ')} (up {_duration(up)})"
    )


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _rank_space_size(info: Mapping[str, Any]) -> tuple[int | None, str]:
    """The width of the publisher-rank space and the field it came from."""
    space = info.get("kv_event_rank_space")
    if isinstance(space, Mapping) and is_int(space.get("size")) and space["size"] > 0:
        return space["size"], "kv_event_rank_space.size"
    try:
        return rank_space(info, [])["size"], "dp_size/attn_dp_size/enable_dp_attention"
    except (ValueError, TypeError):
        pass
    legacy = info.get("kv_events")
    if isinstance(legacy, Mapping) and is_int(legacy.get("dp_size")) and legacy["dp_size"] > 0:
        return legacy["dp_size"], "kv_events.dp_size"
    return None, ""


def _check_sources(info: Mapping[str, Any], flagged: set[str]) -> list[Finding]:
    sources = info.get("kv_event_sources")
    if not isinstance(sources, list):
        return []
    found: list[Finding] = []
    found += _check_rank_space_object(info, sources, flagged)
    size, size_field = _rank_space_size(info)
    ranks_seen: dict[Any, int] = {}
    endpoints_seen: dict[str, str] = {}
    block_sizes: list[tuple[int, int]] = []
    for index, source in enumerate(sources):
        prefix = f"kv_event_sources[{index}]"
        if not isinstance(source, dict):
            continue
        if f"{prefix}.dp_rank" not in flagged:
            found += _check_source_rank(info, source, index, size, size_field, ranks_seen)
        for key in ("endpoint", "replay_endpoint"):
            field = f"{prefix}.{key}"
            endpoint = source.get(key)
            if field in flagged or not isinstance(endpoint, str):
                continue
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
        encoding = source.get("encoding")
        if f"{prefix}.encoding" not in flagged and isinstance(encoding, str):
            found += _check_encoding(encoding, prefix)
        if f"{prefix}.block_size" not in flagged and is_int(source.get("block_size")):
            block_sizes.append((index, source["block_size"]))
    found += _check_block_sizes(info, block_sizes)
    ranks = [source.get("dp_rank") for source in sources if isinstance(source, dict)]
    if all(is_int(rank) for rank in ranks) and ranks != sorted(ranks):
        found.append(
            Finding(
                ERROR,
                "kv_event_sources",
                "kv_event_sources",
                f"not sorted by dp_rank: {_SHORT.repr(ranks)}",
            )
        )
    shapes_ok = not (
        _flagged_under(flagged, "kv_event_sources")
        or _flagged_under(flagged, "kv_event_rank_space")
    )
    if shapes_ok and not any(finding.level == ERROR for finding in found):
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


def _check_encoding(encoding: str, prefix: str) -> list[Finding]:
    if encoding in _DECODABLE_ENCODINGS:
        return []
    return [
        Finding(
            WARNING,
            "kv_event_sources",
            f"{prefix}.encoding",
            f"{encoding!r}: a consumer that decodes only {DEFAULT_ENCODING} cannot read "
            "these batches (probe --listen cannot either)",
        )
    ]


def _check_source_rank(
    info: Mapping[str, Any],
    source: Mapping[str, Any],
    index: int,
    size: int | None,
    size_field: str,
    ranks_seen: dict[Any, int],
) -> list[Finding]:
    field = f"kv_event_sources[{index}].dp_rank"
    rank = source.get("dp_rank")
    if not is_int(rank):
        return []
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
        ranks_seen[rank] = index
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
    if is_int(dp_size) and dp_size >= 1 and rank >= dp_size:
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


def _check_rank_space_object(
    info: Mapping[str, Any], sources: list, flagged: set[str]
) -> list[Finding]:
    space = info.get("kv_event_rank_space")
    field = "kv_event_rank_space"
    if not isinstance(space, dict):
        return []
    found: list[Finding] = []
    widths = {key: space.get(key) for key in ("size", "system_dp_size", "attn_dp_size")}
    widths_ok = not any(f"{field}.{key}" in flagged for key in widths)
    if widths_ok and widths["size"] != widths["system_dp_size"] * widths["attn_dp_size"]:
        found.append(
            Finding(
                ERROR,
                "kv_event_sources",
                f"{field}.size",
                f"{widths['size']} ≠ system_dp_size {widths['system_dp_size']} × "
                f"attn_dp_size {widths['attn_dp_size']}",
            )
        )
    if _flagged_under(flagged, f"{field}.local_ranks"):
        return found
    local = space["local_ranks"]
    advertised = sorted(
        {s.get("dp_rank") for s in sources if isinstance(s, dict) and is_int(s.get("dp_rank"))}
    )
    if sorted(local) != advertised:
        found.append(
            Finding(
                ERROR,
                "kv_event_sources",
                f"{field}.local_ranks",
                f"{_SHORT.repr(local)} does not match the advertised ranks "
                f"{_SHORT.repr(advertised)}",
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
    found: list[Finding] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                field = f"{path}.{key}" if path else str(key)
                if is_secret_name(str(key)) and not path:
                    # Top-level secret names: the schema's patternProperties, from this rule.
                    continue
                if is_secret_name(str(key)) and item not in (None, REDACTED, ""):
                    found.append(
                        Finding(ERROR, "secrets", field, "holds a value; secrets must be redacted")
                    )
                else:
                    walk(item, field)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]")
        elif isinstance(value, str) and redact_text(value) != value:
            found.append(
                Finding(
                    ERROR,
                    "secrets",
                    path or "json_info",
                    "holds an unredacted credential (a URL password, a secret query parameter, "
                    "a secret flag or a secret key inside the text)",
                )
            )

    walk(info, "")
    return found


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


def check_listening(info: Mapping[str, Any], timeout: float) -> list[Finding]:
    found: list[Finding] = []
    sources = info.get("kv_event_sources")
    if not isinstance(sources, list):
        return found
    for index, source in enumerate(sources):
        if not isinstance(source, dict):
            continue
        for key in ("endpoint", "replay_endpoint"):
            endpoint = source.get(key)
            if not isinstance(endpoint, str) or endpoint_problems(endpoint):
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


def health_findings(health: dict) -> list[Finding]:
    status = health["status"]
    if status == "SERVING":
        return [Finding(OK, "health", None, "SERVING")]
    if status == "absent":
        return [Finding(OK, "health", None, "no grpc.health.v1 service (not checked)")]
    if status == "NOT_SERVING":
        return [Finding(ERROR, "health", None, "NOT_SERVING: the node's schedulers are not up")]
    detail = f" ({health['detail']})" if health.get("detail") else ""
    return [Finding(WARNING, "health", None, f"{status}{detail}")]
