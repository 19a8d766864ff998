"""One large topology at a time on this machine, across every test session.

``make test`` runs several SGLang sessions side by side (``scripts/sglang_envs.py test
--jobs N``), each a pytest process launching its own nodes. Most launches are small, but a few
topologies take several GiB at once (a DP 2 prefill engine beside a DP 2 decode engine: about
6.4 GiB PSS). Two of those starting together in two sessions would take the machine past its
memory budget, so a test holds :func:`large_launch` from before its first such node starts
until its last one is stopped: an exclusive ``flock`` on a file every session on the machine
shares (``LOCK_PATH``). Another session's large launch waits for it; small launches never
take the lock and go on meanwhile. The kernel drops the lock when its holder exits, killed or
not, so a crashed session never blocks the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import Iterator

logger = logging.getLogger(__name__)

LOCK_PATH = os.path.join(tempfile.gettempdir(), "sglang-overlay-harness-large-launch.lock")


@contextlib.contextmanager
def large_launch(what: str) -> Iterator[float]:
    """Hold the machine's large-topology lock for the block; yields the seconds waited."""
    started = time.monotonic()
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        waited = time.monotonic() - started
        logger.info("%s: large-launch gate taken after %.0f s", what, waited)
        try:
            yield waited
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
