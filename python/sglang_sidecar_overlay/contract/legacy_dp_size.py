"""The legacy ``dp_size`` switch: whether a node reports ``dp_size`` with its pre-0.5.22
meaning (the number of KV-publisher ranks) for consumers that check ranks against it.

Its own module, standard library only, because an engine reads it as its launch starts
(a bad value fails the launch before any scheduler does), before anything else of the
contract is needed there; ``server_info`` applies it and re-exports it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["DP_SIZE_CHECKING_SIDECARS", "LEGACY_DP_SIZE_ENV", "legacy_dp_size_enabled"]

LEGACY_DP_SIZE_ENV = "SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE"
# Released consumers that check every source's dp_rank against the top-level dp_size
# (ai-dynamo <= 1.6.1): a node whose --sidecar is one of them gets the switch on unless the
# operator set it either way.
DP_SIZE_CHECKING_SIDECARS = frozenset({"dynamo.sglang.sidecar"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def legacy_dp_size_enabled(
    environ: Mapping[str, str] | None = None, sidecar: str | None = None
) -> bool:
    """Whether ``SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE`` asks for pre-0.5.22 ``dp_size``; unset,
    whether the node's ``--sidecar`` module is a consumer that needs it."""
    env = os.environ if environ is None else environ
    raw = env.get(LEGACY_DP_SIZE_ENV)
    if raw is None:
        return sidecar in DP_SIZE_CHECKING_SIDECARS
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{LEGACY_DP_SIZE_ENV}={raw!r} is not a boolean; use one of 1/true/yes/on or 0/false/no/off"
    )
