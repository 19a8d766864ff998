"""The one server-info builder shared by leader and follower nodes.

Pure functions, no SGLang import: adapters turn SGLang's resolved server args and scheduler
ready info into plain mappings and call ``build_server_info``, once per snapshot, in the
process that serves ``GetServerInfo`` (engine or HTTP process). It alone aggregates the
node's sources and computes the rank space; the result is redacted (``redaction``) and
JSON-ready, and ``render_server_info`` turns it into the ``json_info`` text. The contract's
shape is the JSON Schema in ``schema``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from sglang_sidecar_overlay.contract.incarnation import (
    CONTRACT_VERSION,
    Incarnation,
    check_incarnation,
)
from sglang_sidecar_overlay.contract.legacy_dp_size import (
    DP_SIZE_CHECKING_SIDECARS,
    LEGACY_DP_SIZE_ENV,
    legacy_dp_size_enabled,
)
from sglang_sidecar_overlay.contract.redaction import redact
from sglang_sidecar_overlay.contract.sources import aggregate_sources
from sglang_sidecar_overlay.contract.values import is_int

__all__ = [
    "CONTRACT_VERSION",
    "DP_SIZE_CHECKING_SIDECARS",
    "LEGACY_DP_SIZE_ENV",
    "build_server_info",
    "checked_sources",
    "legacy_dp_size_enabled",
    "rank_space",
    "render_server_info",
    "to_jsonable",
]

# --- rank space --------------------------------------------------------------------------------


def rank_space(server_args: Mapping[str, Any], local_ranks: Iterable[int]) -> dict[str, Any]:
    """``kv_event_rank_space``: the width of the publisher-rank space and this node's ranks.

    ``attn_dp_size`` present (0.5.22+): ``dp_size`` counts replicas and ``attn_dp_size``
    attention-DP groups, one of them 1. Absent (0.5.19–0.5.21): ``dp_size`` is the total
    and ``enable_dp_attention`` says whether those are attention-DP groups.
    """
    dp_size = _positive_width(server_args, "dp_size")
    if "attn_dp_size" in server_args:
        system_dp_size = dp_size
        attn_dp_size = _positive_width(server_args, "attn_dp_size")
        if system_dp_size > 1 and attn_dp_size > 1:
            raise ValueError(
                f"dp_size={system_dp_size} with attn_dp_size={attn_dp_size}: SGLang rejects "
                "both > 1, so the publisher-rank space is undefined"
            )
    elif server_args.get("enable_dp_attention"):
        system_dp_size, attn_dp_size = 1, dp_size
    else:
        system_dp_size, attn_dp_size = dp_size, 1
    size = system_dp_size * attn_dp_size
    ranks = sorted(set(local_ranks))
    for rank in ranks:
        if not is_int(rank) or not 0 <= rank < size:
            raise ValueError(
                f"KV source dp_rank {rank!r} is outside the publisher-rank space of size {size} "
                f"(dp_size={system_dp_size}, attn_dp_size={attn_dp_size})"
            )
    return {
        "size": size,
        "system_dp_size": system_dp_size,
        "attn_dp_size": attn_dp_size,
        "local_ranks": ranks,
    }


def _positive_width(server_args: Mapping[str, Any], name: str) -> int:
    value = server_args.get(name, 1)
    if value is None:
        return 1
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


# --- builder -----------------------------------------------------------------------------------


def build_server_info(
    server_args: Mapping[str, Any],
    scheduler_info: Mapping[str, Any],
    *,
    incarnation: Incarnation | Mapping[str, Any],
    launch_command: str | None = None,
    kv_events: Mapping[str, Any] | None = None,
    kv_event_sources: Iterable[Mapping[str, Any]] | None = None,
    legacy_dp_size: bool = False,
) -> dict[str, Any]:
    """The redacted, JSON-ready ``GetServerInfo`` object of one node.

    ``incarnation`` is the launch this snapshot belongs to (``contract.incarnation``): the
    caller chooses it once per launch, so the same inputs always build the same object.
    ``kv_event_sources`` defaults to the scheduler info's own list (``[]`` when absent).
    Raises ``SourceConflictError`` for conflicting sources and ``ValueError`` for a source
    rank outside the publisher-rank space.
    """
    if kv_event_sources is None:
        kv_event_sources = scheduler_info.get("kv_event_sources") or []
    if isinstance(incarnation, Incarnation):
        launch = incarnation.to_json()
    else:
        check_incarnation(incarnation)
        launch = dict(incarnation)
    sources, space = checked_sources(server_args, kv_event_sources)

    info: dict[str, Any] = dict(server_args)
    if launch_command is not None or "launch_command" not in info:
        info["launch_command"] = launch_command
    info.update(scheduler_info)
    info["kv_events"] = kv_events
    info["kv_event_sources"] = sources
    info["kv_event_rank_space"] = space
    info["contract_version"] = CONTRACT_VERSION
    info["incarnation"] = launch
    if legacy_dp_size:
        # The shape every Dynamo version registers exactly: dp_rank < dp_size (<= 1.6.1) and
        # dp_rank < dp_size * attn_dp_size (>= 1.7) both bound the publisher ranks.
        info["dp_size"] = space["size"]
        if "attn_dp_size" in info:
            info["attn_dp_size"] = 1
    built: dict[str, Any] = redact(to_jsonable(info))
    return built


def checked_sources(
    server_args: Mapping[str, Any], kv_event_sources: Iterable[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A node's sources aggregated and its publisher-rank space: what the builder checks.

    Raises ``SourceConflictError`` for conflicting sources and ``ValueError`` for a source
    rank outside the publisher-rank space.
    """
    sources = aggregate_sources(kv_event_sources)
    return sources, rank_space(server_args, (source["dp_rank"] for source in sources))


def to_jsonable(value: Any) -> Any:
    """Plain JSON data: containers rebuilt, anything else rendered with ``str``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, (set, frozenset)):
        # Sorted so the same set always renders the same text.
        return sorted((to_jsonable(item) for item in value), key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    # Enums by value, dataclasses and structs as objects, dates as ISO text: the same
    # conversion upstream applies before json.dumps(default=str).
    try:
        converted = msgspec.to_builtins(value, builtin_types=(bytes,), str_keys=True)
    except TypeError:
        return str(value)
    return to_jsonable(converted)


def render_server_info(info: Mapping[str, Any]) -> str:
    """The ``json_info`` text: stable key order, strict JSON, non-ASCII kept as is."""
    return json.dumps(to_jsonable(info), ensure_ascii=False, allow_nan=False)
