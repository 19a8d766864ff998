"""The side channel that carries scheduler sources past the DP controller (SGLang < 0.5.22).

The DP controller of 0.5.19–0.5.21 runs no plugins and rebuilds its ready message from
scratch, dropping ``kv_event_sources``. So the engine process opens a private directory
before its schedulers spawn, hands it to them with their hook groups
(``_hooks.exported_to_children``), and every scheduler of the launch drops its
ready-time sources there (atomic rename); the engine reads them once all
schedulers are ready and removes the directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sglang_sidecar_overlay.adapters._hooks import from_parent_launch


def write_side_channel(sources: list[dict[str, Any]]) -> None:
    """Drop this scheduler's sources where its engine process will look (atomic rename)."""
    directory = (from_parent_launch() or {}).get("sources_dir")
    if not isinstance(directory, str) or not os.path.isdir(directory):
        return
    target = Path(directory) / f"{os.getpid()}.json"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    with os.fdopen(fd, "w") as handle:
        json.dump(sources, handle)
    os.replace(tmp, target)


class SideChannel:
    """A private directory the launch's schedulers write their sources into.

    Needed before 0.5.22: the DP controller runs no plugins there and rebuilds its ready
    message from scratch, dropping ``kv_event_sources``.
    """

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix=f"sglang-overlay-kvsrc-{os.getpid()}-")

    def read(self) -> list[dict[str, Any]]:
        sources: list[dict[str, Any]] = []
        for entry in sorted(Path(self.path).glob("*.json")):
            sources.extend(json.loads(entry.read_text()))
        return sources

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
