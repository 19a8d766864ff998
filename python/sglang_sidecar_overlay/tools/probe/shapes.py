"""Shape findings: the packaged JSON Schema's errors on one node's server info.

Types, required keys, patterns, enums and the endpoint grammar are checked by the schema alone
(``contract.schema.contract_validator``). Each field gets at most one finding, naming its JSON
location and the bad value; :class:`Flagged` holds those locations, so the cross-field rules
(``checks``) run only on fields whose shape is right.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Mapping
from typing import Any

from sglang_sidecar_overlay.contract.endpoints import endpoint_problems
from sglang_sidecar_overlay.contract.redaction import redact_text
from sglang_sidecar_overlay.contract.schema import ENDPOINT_FORMAT, contract_validator
from sglang_sidecar_overlay.tools.probe.report import ERROR, CheckFindings, Finding, Location
from sglang_sidecar_overlay.tools.probe.rpc import one_line

__all__ = ["SHORT", "Flagged", "check_of", "check_shapes"]

# What contract version 2 added; a node without contract_version lacks them all and is
# reported once, under contract_version.
_VERSION_2_KEYS = frozenset({"incarnation", "encoding"})
# The report's check name for a finding, by the top-level key it concerns.
CHECK_OF_KEY = {
    **dict.fromkeys(
        ("node_rank", "nnodes", "dp_size", "dist_init_addr", "disaggregation_mode"), "topology"
    ),
    **dict.fromkeys(("launch_command", "kv_events", "contract_version", "incarnation"), "contract"),
    **dict.fromkeys(("kv_event_sources", "kv_event_rank_space"), "kv_event_sources"),
}
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
SHORT = reprlib.Repr()
SHORT.maxstring = 80
SHORT.maxother = 80
SHORT.maxlong = 40
SHORT.maxlist = SHORT.maxtuple = 6
SHORT.maxdict = 4
SHORT.maxlevel = 2


class Flagged:
    """The locations the schema flagged."""

    def __init__(self, locations: Iterable[Location] = ()) -> None:
        self._locations = set(locations)

    def has(self, *locations: Location) -> bool:
        """Whether the schema flagged any of ``locations`` itself."""
        return any(location in self._locations for location in locations)

    def under(self, *locations: Location) -> bool:
        """Whether the schema flagged any of ``locations`` or anything inside one."""
        return any(
            flagged[: len(location)] == location
            for flagged in self._locations
            for location in locations
        )


def check_of(location: Location) -> str:
    """The report's check for a location: by its top-level key, else ``schema``."""
    top = location[0] if location else None
    return CHECK_OF_KEY.get(top, "schema") if isinstance(top, str) else "schema"


def check_shapes(info: Mapping[str, Any]) -> tuple[list[Finding], Flagged]:
    """Schema errors as findings naming the JSON location and the bad value, one per field.

    The first error of a field is the one kept: ``type`` comes before the keywords that
    refine it (``minimum``, ``enum``), so a field of the wrong type is not also out of range.
    """
    try:
        validator = contract_validator()
    except ImportError as exc:
        message = f"cannot check shapes: {exc} (install jsonschema, a dependency of this package)"
        unchecked = CheckFindings("schema")
        unchecked.error((), message)
        return unchecked.found, Flagged()
    contract_1 = "contract_version" not in info
    found: list[Finding] = []
    seen: set[Location] = set()
    for error in validator.iter_errors(info):
        for location, level, check, message in _describe(error, contract_1):
            if location not in seen:
                seen.add(location)
                finding = CheckFindings(check)
                finding.add(level, location, message)
                found += finding.found
    return found, Flagged(seen)


def _describe(error: Any, contract_1: bool) -> list[tuple[Location, str, str, str]]:
    """(location, level, check, message) for each finding one ``jsonschema`` error stands for
    (a ``required`` error may name several)."""
    path: Location = tuple(error.absolute_path)
    if error.validator == "required":
        missing = [key for key in error.validator_value if key not in error.instance]
        return [
            (
                (*path, key),
                ERROR,
                check_of((*path, key)),
                (_MISSING.get(key) if not path else None) or "missing (required by the contract)",
            )
            for key in missing
            if not (contract_1 and key in _VERSION_2_KEYS)
        ]
    if "patternProperties" in error.absolute_schema_path:
        # A secret-named key: never echo its value.
        return [(path, ERROR, "secrets", "holds a value; secrets must be redacted")]
    return [(path, ERROR, check_of(path), redact_text(one_line(_message(error))))]


def _message(error: Any) -> str:
    value = error.instance
    kind = error.validator
    expected = error.validator_value
    shown = SHORT.repr(value)
    simple = {
        "minimum": f"must be ≥ {expected}, got {shown}",
        "exclusiveMinimum": f"must be > {expected}, got {shown}",
        "pattern": f"{shown} does not match {expected}",
        "uniqueItems": f"has repeated items: {shown}",
    }
    if kind in simple:
        return simple[kind]
    if kind == "type":
        names = [expected] if isinstance(expected, str) else list(expected)
        described = " or ".join(_TYPE_NAMES.get(name, name) for name in names)
        return f"must be {described}, got {shown}"
    if kind == "enum":
        choices = ", ".join(repr(choice) for choice in expected)
        return f"unknown value {shown}, expected one of {choices}"
    if kind == "minLength" and expected == 1:
        return f"must not be empty, got {shown}"
    if kind == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(str(key) for key in value if key not in allowed)
        return f"unexpected key(s) {SHORT.repr(extra)}; allowed: {', '.join(sorted(allowed))}"
    if (kind == "format" and expected == ENDPOINT_FORMAT) or (
        kind == "anyOf" and error.schema.get("format") == ENDPOINT_FORMAT
    ):
        # The one endpoint grammar says why, naming the endpoint.
        problems = endpoint_problems(value)
        return clip(problems[0]) if problems else f"{shown} is not dialable"
    if kind == "anyOf":
        return f"{shown} matches none of the allowed forms"
    return f"{shown}: {clip(error.message)}"


def clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit]}…"
