"""The contract checks a router relies on, run on one node's ``json_info``.

Shapes (types, required keys, patterns, enums, the endpoint grammar) are checked by the
packaged JSON Schema alone (``shapes``). The rules here are the ones a schema cannot say:
``node_rank`` < ``nnodes``, ranks inside the rank space and unique, ``local_ranks`` equal to
the advertised ranks, the rank space's size, equal block sizes, sorted sources, unique
endpoints, and secrets anywhere by the redaction rule (what each released consumer makes of
``dp_size`` and ``attn_dp_size`` is ``consumers``'s). They run only on fields the schema
passed. Each check group builds its findings with a ``report.CheckFindings``, which also gives
its OK line. Problems are ``Finding``s, never
exceptions.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Mapping
from typing import Any

from sglang_sidecar_overlay.contract.incarnation import CONTRACT_VERSION
from sglang_sidecar_overlay.contract.redaction import REDACTED, is_secret_name, redact_text
from sglang_sidecar_overlay.contract.server_info import rank_space
from sglang_sidecar_overlay.contract.sources import DEFAULT_ENCODING
from sglang_sidecar_overlay.contract.values import is_int
from sglang_sidecar_overlay.tools.probe.report import OK, CheckFindings, Finding, Location
from sglang_sidecar_overlay.tools.probe.shapes import SHORT, Flagged, check_shapes

__all__ = ["MAX_NESTING", "check_server_info", "describe_incarnation", "rank_space_size"]

# Deepest object/array nesting the checks walk; real server info is under 10 levels.
MAX_NESTING = 64
# Batch encodings ``probe --listen`` decodes.
_DECODABLE_ENCODINGS = frozenset({DEFAULT_ENCODING})
_TOPOLOGY_FIELDS = ("node_rank", "nnodes", "dp_size", "dist_init_addr", "disaggregation_mode")
SOURCES = "kv_event_sources"
SPACE = "kv_event_rank_space"


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


def _parse(text: str) -> tuple[dict[str, Any] | None, CheckFindings]:
    """The ``json_info`` object, or None with the ``json`` check's error."""
    found = CheckFindings("json")
    try:
        info = json.loads(text)
    except ValueError as exc:
        found.error((), f"not parsable JSON: {exc}")
        return None, found
    except RecursionError:
        found.error((), f"nests deeper than {MAX_NESTING} levels (too deep to parse)")
        return None, found
    if not isinstance(info, dict):
        found.error((), f"must be a JSON object, got {type(info).__name__}")
        return None, found
    if _nesting_exceeds(info, MAX_NESTING):
        # Server info is a few levels deep; deeper input is hostile and every later walk
        # (schema, checks, --json output) would recurse into it.
        found.error((), f"nests deeper than {MAX_NESTING} levels")
        return None, found
    found.add(OK, (), f"JSON object with {len(info)} keys")
    return info, found


def check_server_info(text: str) -> tuple[dict[str, Any] | None, list[Finding]]:
    """Parse ``json_info`` and check what a router relies on; (info or None, findings)."""
    info, parsed = _parse(text)
    if info is None:
        return None, parsed.found
    shape, flagged = check_shapes(info)
    # Cross-field rules run only on fields whose shape is right.
    return info, [
        *parsed.found,
        *shape,
        *_check_topology(info, flagged),
        *_check_launch(info, flagged),
        *_check_sources(info, flagged),
        *_check_secrets(info),
    ]


# --- topology ----------------------------------------------------------------------------------


def _check_topology(info: Mapping[str, Any], flagged: Flagged) -> list[Finding]:
    topology = CheckFindings("topology")
    nnodes, node_rank = info.get("nnodes"), info.get("node_rank")
    shapes_ok = not flagged.has(("nnodes",), ("node_rank",))
    if shapes_ok and is_int(nnodes) and is_int(node_rank) and node_rank >= nnodes:
        topology.error(("node_rank",), f"{node_rank} is not < nnodes {nnodes}")
    addr = info.get("dist_init_addr")
    if (
        not flagged.has(("dist_init_addr",), ("nnodes",))
        and is_int(nnodes)
        and nnodes > 1
        and (not isinstance(addr, str) or not addr.strip())
    ):
        topology.error(
            ("dist_init_addr",),
            f"must be set when nnodes is {nnodes} (consumers group nodes by it), got {addr!r}",
        )
    summary = (
        f"node_rank={node_rank} nnodes={nnodes} dp_size={info.get('dp_size')} "
        f"dist_init_addr={addr!r}"
    )
    fields_ok = not flagged.has(*((field,) for field in _TOPOLOGY_FIELDS))
    return topology.result((None, summary), shapes_ok=fields_ok)


# --- contract version and launch ---------------------------------------------------------------


def _check_launch(info: Mapping[str, Any], flagged: Flagged) -> list[Finding]:
    """``contract_version`` and ``incarnation``: which contract, and which launch of the node."""
    contract = CheckFindings("contract")
    version = info.get("contract_version")
    if flagged.has(("contract_version",)) or not is_int(version):
        return contract.result()
    if version > CONTRACT_VERSION:
        contract.warning(
            ("contract_version",),
            f"{version} is newer than this probe knows ({CONTRACT_VERSION}): "
            "checks may be incomplete",
        )
        return contract.result()
    if flagged.under(("incarnation",)):
        return contract.result()
    return contract.result((("incarnation",), f"v{version}, {describe_incarnation(info)}"))


def describe_incarnation(info: Mapping[str, Any], now: float | None = None) -> str:
    """``id … started <UTC time> (up …)`` for a node's valid incarnation."""
    launch = info["incarnation"]
    started = float(launch["started_at"])
    try:
        when = datetime.datetime.fromtimestamp(started, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        # Valid by the schema (seconds > 0) but past what a calendar date can hold.
        return f"launch {launch['id']} started at {SHORT.repr(launch['started_at'])} s"
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


# --- sources and the rank space ----------------------------------------------------------------


def rank_space_size(info: Mapping[str, Any]) -> tuple[int | None, str]:
    """The width of the publisher-rank space and the field it came from."""
    space = info.get(SPACE)
    if isinstance(space, Mapping) and is_int(space.get("size")) and space["size"] > 0:
        return space["size"], f"{SPACE}.size"
    try:
        return rank_space(info, [])["size"], "dp_size/attn_dp_size/enable_dp_attention"
    except (ValueError, TypeError):
        pass
    legacy = info.get("kv_events")
    if isinstance(legacy, Mapping) and is_int(legacy.get("dp_size")) and legacy["dp_size"] > 0:
        return legacy["dp_size"], "kv_events.dp_size"
    return None, ""


class _SourceRules:
    """The ``kv_event_sources`` check group: every rule over one node's list of sources."""

    def __init__(self, info: Mapping[str, Any], sources: list[Any], flagged: Flagged) -> None:
        self.info = info
        self.sources = sources
        self.flagged = flagged
        self.found = CheckFindings(SOURCES)
        self.size, self.size_field = rank_space_size(info)
        self.ranks_seen: dict[Any, int] = {}
        self.endpoints_seen: dict[str, str] = {}
        self.block_sizes: list[tuple[int, int]] = []

    def run(self) -> list[Finding]:
        self.rank_space_object()
        for index, source in enumerate(self.sources):
            if isinstance(source, dict):
                self.source(index, source)
        self.equal_block_sizes()
        ranks = self.advertised_ranks()
        int_ranks = [rank for rank in ranks if is_int(rank)]
        if len(int_ranks) == len(ranks) and int_ranks != sorted(int_ranks):
            self.found.error((SOURCES,), f"not sorted by dp_rank: {SHORT.repr(ranks)}")
        described = ", ".join(str(rank) for rank in ranks) or "none"
        summary = (
            f"{len(self.sources)} source(s), ranks {described}, "
            f"rank space {self.size} ({self.size_field})"
        )
        shapes_ok = not self.flagged.under((SOURCES,), (SPACE,))
        return self.found.result(((SOURCES,), summary), shapes_ok=shapes_ok)

    def advertised_ranks(self) -> list[Any]:
        """Each source object's ``dp_rank`` as given (None where it has none)."""
        return [source.get("dp_rank") for source in self.sources if isinstance(source, dict)]

    def source(self, index: int, source: Mapping[str, Any]) -> None:
        at: Location = (SOURCES, index)
        if not self.flagged.has((*at, "dp_rank")):
            self.rank(index, source.get("dp_rank"))
        for key in ("endpoint", "replay_endpoint"):
            endpoint = source.get(key)
            if self.flagged.has((*at, key)) or not isinstance(endpoint, str):
                continue
            other = self.endpoints_seen.get(endpoint)
            if other is not None:
                self.found.error((*at, key), f"{endpoint} is also advertised by {other}")
            else:
                self.endpoints_seen[endpoint] = f"{SOURCES}[{index}].{key}"
        encoding = source.get("encoding")
        decodable = not isinstance(encoding, str) or encoding in _DECODABLE_ENCODINGS
        if not self.flagged.has((*at, "encoding")) and not decodable:
            self.found.warning(
                (*at, "encoding"),
                f"{encoding!r}: a consumer that decodes only {DEFAULT_ENCODING} cannot "
                "read these batches (probe --listen cannot either)",
            )
        if not self.flagged.has((*at, "block_size")) and is_int(source.get("block_size")):
            self.block_sizes.append((index, source["block_size"]))

    def rank(self, index: int, rank: Any) -> None:
        if not is_int(rank):
            return
        at: Location = (SOURCES, index, "dp_rank")
        if rank in self.ranks_seen:
            self.found.error(
                at, f"rank {rank} is also advertised by {SOURCES}[{self.ranks_seen[rank]}]"
            )
        else:
            self.ranks_seen[rank] = index
        if self.size is None:
            self.found.warning(
                at,
                "cannot tell the rank space (no kv_event_rank_space, dp_size or kv_events.dp_size)",
            )
        elif rank >= self.size:
            self.found.error(
                at,
                f"rank {rank} is outside the publisher-rank space of size {self.size} "
                f"({self.size_field})",
            )

    def rank_space_object(self) -> None:
        space = self.info.get(SPACE)
        if not isinstance(space, dict):
            return
        keys = ("size", "system_dp_size", "attn_dp_size")
        size, system_dp, attn_dp = (space.get(key) for key in keys)
        # The schema flags a missing or non-int width, but when it could not run (jsonschema
        # not importable) nothing is flagged: a width that is None (or not an int) has no
        # product to compare, and is left to the schema's finding.
        if (
            not self.flagged.has(*((SPACE, key) for key in keys))
            and is_int(size)
            and is_int(system_dp)
            and is_int(attn_dp)
            and size != system_dp * attn_dp
        ):
            self.found.error(
                (SPACE, "size"),
                f"{size} ≠ system_dp_size {system_dp} × attn_dp_size {attn_dp}",
            )
        local = space.get("local_ranks")
        # Not a list of ints: the schema's finding (or, without the schema, no comparison).
        if self.flagged.under((SPACE, "local_ranks")) or not (
            isinstance(local, list) and all(is_int(rank) for rank in local)
        ):
            return
        advertised = sorted({rank for rank in self.advertised_ranks() if is_int(rank)})
        if sorted(local) != advertised:
            self.found.error(
                (SPACE, "local_ranks"),
                f"{SHORT.repr(local)} does not match the advertised ranks {SHORT.repr(advertised)}",
            )

    def equal_block_sizes(self) -> None:
        if not self.block_sizes:
            return
        first_index, first = self.block_sizes[0]
        for index, size in self.block_sizes[1:]:
            if size != first:
                self.found.error(
                    (SOURCES, index, "block_size"),
                    f"{size} differs from {SOURCES}[{first_index}].block_size {first} "
                    "(a router hashes every rank with one block size)",
                )
        legacy = self.info.get("kv_events")
        if isinstance(legacy, Mapping) and "block_size" in legacy:
            legacy_size = legacy["block_size"]
            if legacy_size != first:
                self.found.error(
                    ("kv_events", "block_size"),
                    f"{legacy_size!r} differs from kv_event_sources block_size {first}",
                )


def _check_sources(info: Mapping[str, Any], flagged: Flagged) -> list[Finding]:
    sources = info.get(SOURCES)
    if not isinstance(sources, list):
        return []
    return _SourceRules(info, sources, flagged).run()


# --- secrets -----------------------------------------------------------------------------------


def _check_secrets(info: Mapping[str, Any]) -> list[Finding]:
    secrets = CheckFindings("secrets")

    def walk(value: Any, location: Location) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                secret = is_secret_name(str(key))
                if secret and not location:
                    # Top-level secret names: the schema's patternProperties, from this rule.
                    continue
                if secret and item not in (None, REDACTED, ""):
                    secrets.error((*location, str(key)), "holds a value; secrets must be redacted")
                else:
                    walk(item, (*location, str(key)))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, (*location, index))
        elif isinstance(value, str) and redact_text(value) != value:
            secrets.error(
                location,
                "holds an unredacted credential (a URL password, a secret query parameter, "
                "a secret flag or a secret key inside the text)",
            )

    walk(info, ())
    return secrets.result()
