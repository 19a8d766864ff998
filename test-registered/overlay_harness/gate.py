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

A lock only serialises; if every session reached its large launches at the same point, all
but one would sit idle at the gate. :func:`staggered` orders each session's tests so that its
large-launch modules (marked ``large_launch``) run at its own point of the run: the first
session's first, the last session's last, the others' in between.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

Item = TypeVar("Item")

logger = logging.getLogger(__name__)

# The pytest mark of a module whose tests take the gate (registered in pytest.ini).
LARGE_LAUNCH_MARK = "large_launch"
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


def staggered(
    items: Sequence[Item],
    module_of: Callable[[Item], object],
    large: Callable[[Item], bool],
    share: tuple[int, int],
) -> list[Item]:
    """``items`` with the large-launch ones moved, whole modules at a time, to session
    ``index`` of ``count``'s point of the run (``share``): the start for the first session, the
    end for the last. The other items keep their order, and no module is split: a unittest
    class's shared launch must stay one launch."""
    index, count = share
    heavy = [item for item in items if large(item)]
    rest = [item for item in items if not large(item)]
    if not heavy or not rest:
        return list(items)
    target = round(len(rest) * index / max(count - 1, 1))
    boundaries = (
        [0]
        + [i for i in range(1, len(rest)) if module_of(rest[i]) != module_of(rest[i - 1])]
        + [len(rest)]
    )
    position = min(boundaries, key=lambda boundary: abs(boundary - target))
    return rest[:position] + heavy + rest[position:]
