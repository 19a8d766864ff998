"""Which launch of a node answered: the ``incarnation`` of the contract, and its version.

A consumer that sees a new ``incarnation.id`` knows the node was relaunched (its publishers
restarted their sequence numbers and lost their replay buffers), not that a network blip
dropped some messages. The id is 128 random bits, chosen once per launch of the node's engine;
``started_at`` is the launch's start time (Unix seconds). Pure data, no SGLang import: the
adapters make one (``Incarnation.new``) when a node's launch begins (``NodeLaunch``) and pass
it to the builder, so the builder itself stays deterministic.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any

__all__ = [
    "CONTRACT_VERSION",
    "Incarnation",
    "check_incarnation",
]

# Bumped when the server-info contract changes shape. 1 is the contract before this field
# (no contract_version, no incarnation, no per-source encoding); 2 adds the three; 3 adds
# each source's replay horizon and queue bounds (replay_buffer_steps, hwm, max_queue_size).
CONTRACT_VERSION = 3

_ID_BITS = 128
_ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")


@dataclasses.dataclass(frozen=True)
class Incarnation:
    """One launch of one node: a random 128-bit hex id and the launch's start time."""

    id: str
    started_at: float

    def __post_init__(self) -> None:
        check_incarnation(self.to_json())

    @classmethod
    def new(cls, started_at: float | None = None) -> Incarnation:
        """A fresh incarnation; ``started_at`` defaults to now."""
        return cls(
            id=secrets.token_hex(_ID_BITS // 8),
            started_at=time.time() if started_at is None else float(started_at),
        )

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "started_at": self.started_at}


def check_incarnation(value: Any) -> None:
    """Raise ``ValueError`` naming the bad part unless ``value`` is a valid incarnation object."""
    if not isinstance(value, Mapping):
        raise ValueError(f"incarnation must be an object with id and started_at, got {value!r}")
    ident = value.get("id")
    if not isinstance(ident, str) or not _ID_PATTERN.match(ident):
        raise ValueError(f"incarnation.id must be 32 lowercase hex digits, got {ident!r}")
    started = value.get("started_at")
    if isinstance(started, bool) or not isinstance(started, (int, float)) or not started > 0:
        raise ValueError(f"incarnation.started_at must be Unix seconds > 0, got {started!r}")
    extra = sorted(set(value) - {"id", "started_at"})
    if extra:
        raise ValueError(f"incarnation has unknown keys {extra}")
