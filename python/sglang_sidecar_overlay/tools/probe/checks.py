"""The contract checks a router relies on, run on one node's ``json_info``.

The packaged JSON Schema (``contract.schema``) checks shapes; the rules here are the ones a
schema cannot say (ranks inside the rank space, ``local_ranks``, equal block sizes, the
``dp_size`` pitfall, secrets by the redaction rule, dialable endpoints, live listeners).
Problems are ``Finding``s, never exceptions.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import stat
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sglang_sidecar_overlay.contract.endpoints import endpoint_problems
from sglang_sidecar_overlay.contract.incarnation import CONTRACT_VERSION, check_incarnation
from sglang_sidecar_overlay.contract.redaction import REDACTED, is_secret_name, redact_text
from sglang_sidecar_overlay.contract.schema import load_schema
from sglang_sidecar_overlay.contract.server_info import rank_space
from sglang_sidecar_overlay.contract.sources import DEFAULT_ENCODING
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
_DISAGGREGATION_MODES = frozenset({"null", "agg", "aggregated", "prefill", "decode"})
# What contract version 2 added; a node without contract_version lacks them all.
_VERSION_2_KEYS = ("contract_version", "incarnation", "encoding")
# Batch encodings ``probe --listen`` decodes.
_DECODABLE_ENCODINGS = frozenset({DEFAULT_ENCODING})


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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
        # (checks, schema, --json output) would recurse into it.
        message = f"nests deeper than {MAX_NESTING} levels"
        return None, [Finding(ERROR, "json", "json_info", message)]
    findings = [Finding(OK, "json", "json_info", f"JSON object with {len(info)} keys")]
    findings += _check_topology(info)
    findings += _check_overlay_keys(info)
    findings += _check_launch(info)
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
    if mode is not None and (not isinstance(mode, str) or mode not in _DISAGGREGATION_MODES):
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


def _check_launch(info: Mapping[str, Any]) -> list[Finding]:
    """``contract_version`` and ``incarnation``: which contract, and which launch of the node."""
    found: list[Finding] = []
    version = info.get("contract_version")
    if "contract_version" not in info:
        found.append(
            Finding(
                ERROR,
                "contract",
                "contract_version",
                "missing: the node serves contract version 1 (no incarnation, no source "
                "encoding), so consumers cannot tell a relaunch from a network blip",
            )
        )
    elif not _is_int(version) or version < 2:
        found.append(
            Finding(ERROR, "contract", "contract_version", f"must be an int ≥ 2, got {version!r}")
        )
    elif version > CONTRACT_VERSION:
        found.append(
            Finding(
                WARNING,
                "contract",
                "contract_version",
                f"{version} is newer than this probe knows ({CONTRACT_VERSION}): "
                "checks may be incomplete",
            )
        )
    if "incarnation" not in info:
        if "contract_version" in info:
            found.append(Finding(ERROR, "contract", "incarnation", "missing"))
        return found
    try:
        check_incarnation(info["incarnation"])
    except ValueError as exc:
        found.append(Finding(ERROR, "contract", "incarnation", str(exc)))
        return found
    if not found:
        found.append(
            Finding(OK, "contract", "incarnation", f"v{version}, {describe_incarnation(info)}")
        )
    return found


def describe_incarnation(info: Mapping[str, Any], now: float | None = None) -> str:
    """``id … started <UTC time> (up …)`` for a node's valid incarnation."""
    launch = info["incarnation"]
    started = float(launch["started_at"])
    when = datetime.datetime.fromtimestamp(started, tz=datetime.timezone.utc)
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
    if isinstance(space, Mapping) and _is_int(space.get("size")) and space["size"] > 0:
        return space["size"], "kv_event_rank_space.size"
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
            problems = endpoint_problems(source.get(key))
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
        found += _check_encoding(source, prefix)
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


def _check_encoding(source: Mapping[str, Any], prefix: str) -> list[Finding]:
    encoding = source.get("encoding")
    field = f"{prefix}.encoding"
    if "encoding" not in source:
        # The schema names it; a contract-1 node is reported once under contract_version.
        return []
    if not isinstance(encoding, str) or not encoding:
        return [Finding(ERROR, "kv_event_sources", field, f"must be a name, got {encoding!r}")]
    if encoding not in _DECODABLE_ENCODINGS:
        return [
            Finding(
                WARNING,
                "kv_event_sources",
                field,
                f"{encoding!r}: a consumer that decodes only {DEFAULT_ENCODING} cannot read "
                "these batches (probe --listen cannot either)",
            )
        ]
    return []


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
    ranks_ok = isinstance(local, list) and all(_is_int(rank) for rank in local)
    if not ranks_ok or sorted(local) != advertised:
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


def _check_schema(info: Mapping[str, Any], earlier: Sequence[Finding]) -> list[Finding]:
    """JSON Schema validation when jsonschema is importable; silent otherwise."""
    try:
        import jsonschema

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
        if "contract_version" in flagged and _is_version_2_key(problem):
            # A contract-1 node: reported once, under contract_version.
            continue
        found.append(Finding(ERROR, "schema", field, one_line(problem.message)))
    return found


def _is_version_2_key(problem: Any) -> bool:
    if problem.validator != "required":
        return False
    return any(f"'{key}'" in problem.message for key in _VERSION_2_KEYS)


def _json_path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


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
