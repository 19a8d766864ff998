"""The ``dp_size`` switch: whether a node reports the data-parallel widths in the shape every
released Dynamo consumer registers exactly, for consumers that check ranks against them.

From 0.5.22, ``--dp N --enable-dp-attention`` reports ``dp_size=1, attn_dp_size=N`` while the
sources carry ranks ``0..N-1``. Released consumers read those widths two ways:

- ai-dynamo <= 1.6.1 checks ``dp_rank < dp_size`` (and registers ``dp_size`` ranks);
- ai-dynamo >= 1.7 checks ``dp_rank < dp_size * attn_dp_size`` (and registers that product).

With the switch on, ``dp_size`` is the number of KV-publisher ranks and ``attn_dp_size``
(where the release reports it) is 1: both rules then see exactly the ranks that exist, so the
default is right for either consumer version without asking which one is installed. SGLang's
own widths stay in ``kv_event_rank_space`` and ``enable_dp_attention``.

Its own module, standard library only, because an engine reads it as its launch starts
(a bad value fails the launch before any scheduler does), before anything else of the
contract is needed there; ``server_info`` applies it and re-exports it.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping

__all__ = [
    "CONSUMER_DISTRIBUTIONS",
    "DP_SIZE_CHECKING_SIDECARS",
    "LEGACY_DP_SIZE_ENV",
    "consumer_version",
    "legacy_dp_size_decision",
    "legacy_dp_size_enabled",
]

LEGACY_DP_SIZE_ENV = "SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE"
# Released consumers that check every source's dp_rank against the top-level widths
# (ai-dynamo, every version so far): a node whose --sidecar is one of them gets the switch on
# unless the operator set it either way.
DP_SIZE_CHECKING_SIDECARS = frozenset({"dynamo.sglang.sidecar"})
# The distribution that carries each such consumer's checks, named in the launch's log.
CONSUMER_DISTRIBUTIONS = {"dynamo.sglang.sidecar": "ai-dynamo-runtime"}
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def legacy_dp_size_enabled(
    environ: Mapping[str, str] | None = None, sidecar: str | None = None
) -> bool:
    """Whether ``SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE`` asks for the consumers' shape; unset,
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


def consumer_version(sidecar: str | None) -> tuple[str, str | None] | None:
    """The distribution behind a known ``--sidecar`` consumer and its version in this Python
    environment (None when not installed); None for a sidecar the overlay does not know."""
    distribution = CONSUMER_DISTRIBUTIONS.get(sidecar or "")
    if distribution is None:
        return None
    try:
        return distribution, importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return distribution, None


def legacy_dp_size_decision(
    enabled: bool, sidecar: str | None, environ: Mapping[str, str] | None = None
) -> str:
    """One line for the launch's log: the switch's state, what it was based on (with the
    consumer's installed version) and the shape it serves."""
    env = os.environ if environ is None else environ
    if LEGACY_DP_SIZE_ENV in env:
        basis = f"{LEGACY_DP_SIZE_ENV}={env[LEGACY_DP_SIZE_ENV]!r} set by the operator"
    else:
        basis = f"{LEGACY_DP_SIZE_ENV} not set: on for --sidecar {sidecar}"
    consumer = consumer_version(sidecar)
    if consumer is not None:
        distribution, version = consumer
        basis += f" ({distribution} {version or 'not installed here'})"
    if not enabled:
        return f"{basis}: dp_size and attn_dp_size reported as SGLang resolved them"
    return (
        f"{basis}: dp_size reports the KV-publisher ranks and attn_dp_size 1, the shape "
        "Dynamo <= 1.6.1 (dp_rank < dp_size) and >= 1.7 (dp_rank < dp_size * attn_dp_size) "
        "both register exactly (set it to 0 to report SGLang's own widths)"
    )
