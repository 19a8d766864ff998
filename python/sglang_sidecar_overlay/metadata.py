"""The one server-info builder shared by leader and follower nodes, with redaction.

Pure functions, no SGLang import: adapters turn SGLang's resolved server args and scheduler
ready info into plain mappings and call ``build_server_info``, once per snapshot, in the
process that serves ``GetServerInfo`` (engine or HTTP process). The result is redacted and
JSON-ready; ``render_server_info`` turns it into the ``json_info`` text. The contract is
written down in ``server-info.schema.json`` next to this module (``load_schema``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

import msgspec

from sglang_sidecar_overlay.kv_sources import aggregate_sources

logger = logging.getLogger("sglang_sidecar_overlay.metadata")

__all__ = [
    "LEGACY_DP_SIZE_ENV",
    "REDACTED",
    "REDACTION_EXCEPTIONS",
    "SECRET_WORDS",
    "build_server_info",
    "is_secret_name",
    "legacy_dp_size_enabled",
    "load_schema",
    "rank_space",
    "redact",
    "redact_launch_command",
    "render_server_info",
]

LEGACY_DP_SIZE_ENV = "SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})

REDACTED = "<redacted>"
SECRET_WORDS = frozenset(
    {"key", "secret", "token", "password", "passwd", "credential", "credentials"}
)
# Field names of the supported releases that end in a secret word but hold no secret.
REDACTION_EXCEPTIONS = frozenset(
    {"bucket_time_to_first_token", "kt_max_deferred_experts_per_token"}
)

SCHEMA_RESOURCE = "server-info.schema.json"
_ENV_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)


# --- legacy dp_size switch -------------------------------------------------------------------


def legacy_dp_size_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE`` asks for pre-0.5.22 ``dp_size``."""
    env = os.environ if environ is None else environ
    raw = env.get(LEGACY_DP_SIZE_ENV)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{LEGACY_DP_SIZE_ENV}={raw!r} is not a boolean; use one of 1/true/yes/on or 0/false/no/off"
    )


# --- rank space --------------------------------------------------------------------------------


def rank_space(server_args: Mapping[str, Any], local_ranks: Iterable[int]) -> dict:
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
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
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
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


# --- builder -----------------------------------------------------------------------------------


def build_server_info(
    server_args: Mapping[str, Any],
    scheduler_info: Mapping[str, Any],
    *,
    launch_command: str | None = None,
    kv_events: Mapping[str, Any] | None = None,
    kv_event_sources: Iterable[Mapping] | None = None,
    legacy_dp_size: bool = False,
) -> dict:
    """The redacted, JSON-ready ``GetServerInfo`` object of one node.

    ``kv_event_sources`` defaults to the scheduler info's own list (``[]`` when absent).
    Raises ``SourceConflictError`` for conflicting sources and ``ValueError`` for a source
    rank outside the publisher-rank space.
    """
    if kv_event_sources is None:
        kv_event_sources = scheduler_info.get("kv_event_sources") or []
    sources = aggregate_sources(kv_event_sources)
    space = rank_space(server_args, (source["dp_rank"] for source in sources))

    info: dict[str, Any] = dict(server_args)
    if launch_command is not None or "launch_command" not in info:
        info["launch_command"] = launch_command
    info.update(scheduler_info)
    info["kv_events"] = kv_events
    info["kv_event_sources"] = sources
    info["kv_event_rank_space"] = space
    if legacy_dp_size:
        # Pre-0.5.22 meaning for consumers that check dp_rank < dp_size.
        info["dp_size"] = space["size"]
    return redact(to_jsonable(info))


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


# --- redaction ---------------------------------------------------------------------------------


def is_secret_name(name: str) -> bool:
    """A name whose last ``_``/``-``-separated word names a secret, minus the exceptions."""
    normalized = name.strip().lstrip("-").replace("-", "_").lower()
    if normalized in REDACTION_EXCEPTIONS:
        return False
    return normalized.rsplit("_", 1)[-1] in SECRET_WORDS


def redact(value: Any) -> Any:
    """A copy with secret-named keys at any depth hidden, ``launch_command`` included.

    ``None`` stays ``None``: an unset secret reveals nothing, and consumers can still tell
    "not configured" from "configured".
    """
    if isinstance(value, Mapping):
        return {key: _redact_item(key, item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, tuple):
        return tuple(redact(item) for item in value)
    return value


def _redact_item(key: Any, item: Any) -> Any:
    if isinstance(key, str) and is_secret_name(key):
        return None if item is None else REDACTED
    if key == "launch_command" and isinstance(item, str):
        return redact_launch_command(item)
    return redact(item)


def redact_launch_command(command: str) -> str:
    """The command line with secret ``--flag value`` / ``--flag=value`` values hidden.

    Also hides ``NAME=value`` environment assignments and secret keys inside JSON-valued
    arguments. Returns the input unchanged when nothing needed hiding.
    """
    try:
        words = shlex.split(command)
    except ValueError:
        # Unbalanced quotes: fall back to whitespace so a secret is still found.
        words = command.split()
    redacted = _redact_words(words)
    if redacted == words:
        return command
    return shlex.join(redacted)


def _redact_words(words: list[str]) -> list[str]:
    result: list[str] = []
    hide_next = False
    for word in words:
        if hide_next and not word.startswith("--"):
            result.append(REDACTED)
            hide_next = False
            continue
        hide_next = (
            word.startswith("-")
            and "=" not in word
            and not _has_space(word)
            and is_secret_name(word)
        )
        result.append(word if hide_next else _redact_word(word))
    return result


def _is_bare_secret_flag(word: str) -> bool:
    """``--api-key`` whose value is the next word."""
    return (
        word.startswith("-") and "=" not in word and not _has_space(word) and is_secret_name(word)
    )


def _redact_word(word: str) -> str:
    """One argument: ``--flag=value``, ``NAME=value``, JSON, or a quoted nested command."""
    name, eq, value = word.partition("=")
    if eq and not _has_space(name) and (word.startswith("-") or _ENV_ASSIGNMENT.match(word)):
        if is_secret_name(name):
            return f"{name}={REDACTED}"
        inner = _redact_word(value)
        return word if inner == value else f"{name}={inner}"
    if word.startswith("{"):
        redacted_json = _redact_json_word(word)
        if redacted_json is not None:
            return redacted_json
    if _has_space(word):
        # A quoted argument can carry a whole command line of its own.
        return redact_launch_command(word)
    return word


def _has_space(text: str) -> bool:
    return any(char.isspace() for char in text)


def _redact_json_word(word: str) -> str | None:
    """The JSON argument with secret keys hidden; None when the word is not JSON."""
    try:
        parsed = json.loads(word)
    except ValueError:
        return None
    cleaned = redact(parsed)
    return word if cleaned == parsed else json.dumps(cleaned, ensure_ascii=False)


# --- schema ------------------------------------------------------------------------------------


def load_schema() -> dict:
    """The JSON Schema of the server-info contract, shipped inside the package."""
    text = resources.files(__package__).joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8")
    return json.loads(text)
