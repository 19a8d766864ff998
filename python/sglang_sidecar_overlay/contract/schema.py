"""The JSON Schema of the server-info contract, shipped inside the package, and its validator.

The schema is the source of shape checks (types, required keys, patterns, enums, the endpoint
grammar): the probe validates served JSON with :func:`contract_validator` and keeps only the
cross-field rules a schema cannot say. Two places where the validator reads the schema more
strictly than a generic JSON Schema validator, because consumers do:

- ``integer`` is a number written without a fraction (``1``, not ``1.0``) and ``number`` is
  finite (JSON has no NaN or Infinity): typed consumers (serde, Go) reject both.
- ``format: kv-event-endpoint`` is checked with the one endpoint grammar
  (``contract.endpoints.endpoint_problems``). The schema's ``pattern`` next to it says the
  same thing portably for other validators, but cannot say all of it (which bracketed text
  is an IPv6 address, which ``ipc://`` path is already normalised); it never rejects an
  endpoint the grammar accepts.
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources
from typing import Any

from sglang_sidecar_overlay.contract.endpoints import endpoint_problems
from sglang_sidecar_overlay.contract.values import is_int

__all__ = ["ENDPOINT_FORMAT", "SCHEMA_RESOURCE", "contract_validator", "load_schema"]

SCHEMA_RESOURCE = "server-info.schema.json"
# The schema's format name for a dialable ZMQ endpoint, checked by the endpoint grammar.
ENDPOINT_FORMAT = "kv-event-endpoint"


def load_schema() -> dict[str, Any]:
    """The JSON Schema of the server-info contract, shipped inside the package."""
    text = resources.files(__package__).joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _is_integer(_checker: Any, value: Any) -> bool:
    return is_int(value)


def _is_number(_checker: Any, value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _is_endpoint(value: Any) -> bool:
    # Only strings carry a format; the type keyword reports anything else.
    return not isinstance(value, str) or not endpoint_problems(value)


def contract_validator(schema: dict[str, Any] | None = None) -> Any:
    """A ``jsonschema`` Draft 2020-12 validator of ``schema`` (default: the contract's).

    Reads ``integer``/``number`` strictly and checks ``format: kv-event-endpoint`` with the
    endpoint grammar (see the module docstring). Imports ``jsonschema`` on first use only.
    """
    import jsonschema

    formats = jsonschema.FormatChecker(formats=())
    formats.checks(ENDPOINT_FORMAT)(_is_endpoint)
    return _validator_class()(load_schema() if schema is None else schema, format_checker=formats)


@functools.lru_cache(maxsize=1)
def _validator_class() -> Any:
    import jsonschema

    base = jsonschema.Draft202012Validator
    types = base.TYPE_CHECKER.redefine_many({"integer": _is_integer, "number": _is_number})
    # jsonschema types extend() loosely (no annotations): the class it makes is ours to type.
    return jsonschema.validators.extend(base, type_checker=types)  # type: ignore[no-untyped-call]
