"""Describe a node's KV-event publishers and aggregate them into ``kv_event_sources``.

Pure functions, no SGLang import. ``describe_source`` runs in the scheduler process that
owns the publisher, right after the PUB (and replay ROUTER) sockets are bound: a relative
``ipc://`` path is resolved against *that* process's working directory. ``aggregate_sources``
runs wherever a node's ready messages meet (engine process or DP controller) and rejects
conflicting entries at startup, so no consumer has to discover them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from sglang_sidecar_overlay.contract.endpoints import normalize_endpoint
from sglang_sidecar_overlay.contract.values import is_int

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_ENCODING",
    "SOURCE_BOUNDS",
    "KvEventSource",
    "SourceConflictError",
    "aggregate_sources",
    "describe_source",
]


class _KvEventSourceRequired(TypedDict):
    dp_rank: int
    endpoint: str
    topic: str
    block_size: int
    encoding: str


class KvEventSource(_KvEventSourceRequired, total=False):
    """One ``kv_event_sources`` entry as served (the schema's ``kv_event_source``)."""

    replay_endpoint: str
    # The publisher's effective bounds, each a count of batches (0: the publisher applies
    # none; replay_buffer_steps 0: nothing is kept for replay). Reported only where SGLang's
    # publisher exposes them; never filled in with defaults.
    replay_buffer_steps: int
    hwm: int
    max_queue_size: int


_KEYS = tuple(KvEventSource.__annotations__)
# What a reported entry must carry: an entry without ``encoding`` gets DEFAULT_ENCODING.
_SOURCE_KEYS = tuple(
    key for key in _KEYS if key in KvEventSource.__required_keys__ and key != "encoding"
)
SOURCE_BOUNDS = ("replay_buffer_steps", "hwm", "max_queue_size")
_OPTIONAL_KEYS = tuple(key for key in _KEYS if key not in _SOURCE_KEYS)

# The wire format of the event batches (third frame of a live message): SGLang's
# ZmqEventPublisher packs every KVEventBatch with msgspec's msgpack encoder. An entry reported
# without ``encoding`` (upstream 0.5.22+ schedulers) comes from that publisher.
DEFAULT_ENCODING = "msgpack"


class SourceConflictError(ValueError):
    """Two KV-event sources of one node claim the same rank or the same address."""


def describe_source(
    dp_rank: int,
    bound_endpoint: str | None,
    topic: str,
    block_size: int,
    replay_endpoint: str | None = None,
    encoding: str = DEFAULT_ENCODING,
    bounds: Mapping[str, int] | None = None,
) -> dict[str, Any] | None:
    """One ``kv_event_sources`` entry for a bound publisher, or None when not subscribable.

    ``bound_endpoint`` and ``replay_endpoint`` are what the sockets report after bind
    (ZMQ ``LAST_ENDPOINT``); pass ``None`` for a connect-style publisher or no replay socket.
    ``block_size`` is page_size × dcp_size, the size a router must hash with; ``encoding``
    the wire format of the event batches; ``bounds`` the publisher's effective
    ``SOURCE_BOUNDS`` that are known (the others are left out).
    """
    _check_rank(dp_rank)
    _check_block_size(block_size)
    _check_encoding(encoding)
    checked_bounds = _checked_bounds(bounds or {})
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, got {topic!r}")
    endpoint = normalize_endpoint(bound_endpoint)
    if endpoint is None:
        logger.debug("KV publisher of rank %d at %r is not advertised", dp_rank, bound_endpoint)
        return None
    source: dict[str, Any] = {
        "dp_rank": dp_rank,
        "endpoint": endpoint,
        "topic": topic,
        "block_size": block_size,
        "encoding": encoding,
    }
    replay = normalize_endpoint(replay_endpoint)
    if replay is not None:
        source["replay_endpoint"] = replay
    elif replay_endpoint is not None:
        logger.debug("replay endpoint %r of rank %d is not advertised", replay_endpoint, dp_rank)
    source.update(checked_bounds)
    return source


def _checked_bounds(bounds: Mapping[str, Any]) -> dict[str, int]:
    unknown = sorted(set(bounds) - set(SOURCE_BOUNDS))
    if unknown:
        raise ValueError(f"unknown KV source bounds {unknown}; known: {list(SOURCE_BOUNDS)}")
    checked = {}
    for key in SOURCE_BOUNDS:
        if key in bounds:
            value = bounds[key]
            if not is_int(value) or value < 0:
                raise ValueError(f"{key} must be an int >= 0 (batches), got {value!r}")
            checked[key] = value
    return checked


def _check_rank(dp_rank: Any) -> None:
    if not is_int(dp_rank) or dp_rank < 0:
        raise ValueError(f"dp_rank must be a non-negative int, got {dp_rank!r}")


def _check_block_size(block_size: Any) -> None:
    # A wrong block size makes routers miss silently, so refuse anything but a positive int.
    if not is_int(block_size) or block_size <= 0:
        raise ValueError(
            f"block_size must be a positive int (page_size x dcp_size), got {block_size!r}"
        )


def _check_encoding(encoding: Any) -> None:
    if not isinstance(encoding, str) or not encoding or encoding != encoding.strip():
        raise ValueError(
            f"encoding must be a non-empty name such as {DEFAULT_ENCODING!r}, got {encoding!r}"
        )


def aggregate_sources(sources: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A node's sources: exact duplicates dropped, sorted by ``dp_rank``, conflicts refused.

    Every returned entry carries ``encoding``; an entry without one gets ``DEFAULT_ENCODING``.
    Reported ``SOURCE_BOUNDS`` are kept (checked, never added).

    Raises ``SourceConflictError`` when two entries share a rank but differ, or when one
    address (endpoint or replay endpoint) is claimed by two ranks; ``ValueError`` for a
    malformed entry.
    """
    by_rank: dict[int, dict[str, Any]] = {}
    owner_of_address: dict[str, dict[str, Any]] = {}
    for raw in sources:
        source = _checked_source(raw)
        known = by_rank.get(source["dp_rank"])
        if known is not None:
            if known != source:
                raise SourceConflictError(
                    f"two KV sources claim dp_rank {source['dp_rank']}: {known!r} and {source!r}"
                )
            continue
        for address in _addresses(source):
            other = owner_of_address.get(address)
            if other is not None:
                raise SourceConflictError(
                    f"address {address} is claimed by two KV sources: {other!r} and {source!r}"
                )
            owner_of_address[address] = source
        by_rank[source["dp_rank"]] = source
    return [by_rank[rank] for rank in sorted(by_rank)]


def _addresses(source: Mapping[str, Any]) -> list[str]:
    addresses = [source["endpoint"]]
    replay = source.get("replay_endpoint")
    if replay is not None and replay != source["endpoint"]:
        addresses.append(replay)
    return addresses


def _checked_source(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A plain-dict copy of one entry, with its shape and endpoints checked."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"a KV source must be a mapping, got {raw!r}")
    missing = [key for key in _SOURCE_KEYS if key not in raw]
    unknown = [key for key in raw if key not in _SOURCE_KEYS + _OPTIONAL_KEYS]
    if missing or unknown:
        raise ValueError(f"KV source {dict(raw)!r}: missing keys {missing}, unknown keys {unknown}")
    _check_rank(raw["dp_rank"])
    _check_block_size(raw["block_size"])
    if not isinstance(raw["topic"], str):
        raise ValueError(f"KV source {dict(raw)!r}: topic must be a str")
    source = {key: raw[key] for key in _SOURCE_KEYS}
    encoding = raw.get("encoding", DEFAULT_ENCODING)
    try:
        _check_encoding(encoding)
    except ValueError as exc:
        raise ValueError(f"KV source {dict(raw)!r}: {exc}") from None
    source["encoding"] = encoding
    _check_advertisable(raw["endpoint"], raw)
    if raw.get("replay_endpoint") is not None:
        _check_advertisable(raw["replay_endpoint"], raw)
        source["replay_endpoint"] = raw["replay_endpoint"]
    try:
        source.update(_checked_bounds({k: raw[k] for k in SOURCE_BOUNDS if k in raw}))
    except ValueError as exc:
        raise ValueError(f"KV source {dict(raw)!r}: {exc}") from None
    return source


def _check_advertisable(endpoint: Any, raw: Mapping[str, Any]) -> None:
    # Entries must already be in advertised form: a wildcard or relative path here would
    # reach consumers unchanged.
    if not isinstance(endpoint, str) or normalize_endpoint(endpoint) != endpoint:
        raise ValueError(f"KV source {dict(raw)!r}: {endpoint!r} is not an advertisable endpoint")
