"""Node-local KV-event metadata and a supervised ``--sidecar`` for every node of an SGLang group.

The pure core (``metadata``, ``kv_sources``, ``follower``, ``sidecar`` and the native
``_native`` module) imports nothing from SGLang; ``adapters`` translate SGLang objects into
plain data and ``plugin`` installs the adapter matching the installed SGLang release.
"""

import logging

__version__ = "0.1.0"

logger = logging.getLogger("sglang_sidecar_overlay")

__all__ = ["__version__", "logger"]
