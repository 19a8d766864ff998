"""Node-local KV-event metadata and a supervised ``--sidecar`` for every node of an SGLang group.

The data flows through the subpackages in order: ``contract`` (endpoints, KV sources, the one
server-info builder, redaction, the schema) -> ``server`` (the follower metadata server around
the native ``_native`` module) -> consumers, with ``sidecar`` (the supervised ``--sidecar``)
beside it and ``tools`` (status, probe, selftest) on the operator's side. All of that imports
nothing from SGLang; ``adapters`` translate SGLang objects into plain data and ``plugin``
installs the adapter matching the installed SGLang release.
"""

import logging

logger = logging.getLogger(__name__)

__all__ = ["__version__", "logger"]


def __getattr__(name: str) -> str:
    # Read lazily: the plugin imports this package in every SGLang process.
    if name == "__version__":
        from importlib import metadata

        return metadata.version("sglang-sidecar-overlay")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
