"""The shared cache of the project's scripts, and the lock that keeps two runs apart in it.

Standard library only. Everything the scripts download or build once (SGLang wheels, uv, the
SGLang environments, the rebuilt wheel, benchmark downloads) lives below one root:
``$SGLANG_OVERLAY_CACHE``, default ``~/.cache/sglang-sidecar-overlay``. Whatever builds an
entry there holds :func:`locked` on a sibling ``.lock`` file while it does, so runs sharing the
cache (side-by-side sessions, two developers' checkouts) never build the same entry at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

CACHE_ENV = "SGLANG_OVERLAY_CACHE"


def cache_root() -> Path:
    """The cache root: ``$SGLANG_OVERLAY_CACHE`` or ``~/.cache/sglang-sidecar-overlay``."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "sglang-sidecar-overlay"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created with its parents) for the block's duration."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
