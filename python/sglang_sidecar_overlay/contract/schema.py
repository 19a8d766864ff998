"""The JSON Schema of the server-info contract, shipped inside the package.

The schema is the source of shape checks: the probe validates served JSON against it and
keeps only the cross-field rules a schema cannot say.
"""

from __future__ import annotations

import json
from importlib import resources

__all__ = ["SCHEMA_RESOURCE", "load_schema"]

SCHEMA_RESOURCE = "server-info.schema.json"


def load_schema() -> dict:
    """The JSON Schema of the server-info contract, shipped inside the package."""
    text = resources.files(__package__).joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8")
    return json.loads(text)
