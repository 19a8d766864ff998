"""Prefill/decode disaggregation under ordinary DP: the prefill sender uses the replica's rank.

On every supported release (0.5.19–0.5.23) ``CommonKVSender.__init__`` dispatches on
``kv_mgr.attn_dp_rank``: under ``follow_bootstrap_room`` it fails the request as a
"follow_bootstrap_room conflict" when that rank is not ``bootstrap_room % <DP ranks>``, and
otherwise ``_register_prefill_dp_rank`` posts it to the bootstrap server for the decode side to
query. With ordinary DP every replica's attention-DP rank is 0, while the bootstrap server
files each replica's connection info under ``system_dp_rank`` (and KV-event publishers use the
replica's rank too). So a request on replica 1 is refused, or registered as rank 0 and the
decode side fetches replica 0's connection info.

One ``AROUND`` hook on ``CommonKVSender.__init__`` (same target on every supported release;
Mooncake, NIXL, Mori and Ascend senders reach it through ``super().__init__`` or inherit it)
runs upstream's constructor unchanged, with the manager seen through a view whose
``attn_dp_rank`` is the bootstrap DP rank — the rule the bootstrap server applies to
``/route`` registrations: the attention-DP rank when ``system_dp_size == 1``, else the
replica's ``system_dp_rank``. Where the two agree (attention DP, a single replica, replica 0)
the original runs with the manager itself. The sender keeps the real manager afterwards.

The sender lives in scheduler processes of a prefill node, so the hook is registered there
only (``_hooks``: the launch exports the ``prefill_sender`` group to its children).
"""

from __future__ import annotations

from typing import Any

from sglang_sidecar_overlay.adapters._hooks import Hook

SENDER_INIT = "sglang.srt.disaggregation.common.conn.CommonKVSender.__init__"


def bootstrap_dp_rank(
    attn_dp_rank: int, system_dp_size: int | None, system_dp_rank: int | None
) -> int:
    """The DP rank the bootstrap server files a prefill rank under (its ``/route`` rule)."""
    if not system_dp_size or system_dp_size == 1:
        return attn_dp_rank
    return system_dp_rank or 0


class _BootstrapRankView:
    """A KV manager as the sender's constructor sees it: itself, but with the bootstrap rank."""

    __slots__ = ("_mgr", "attn_dp_rank")

    def __init__(self, mgr: Any, rank: int) -> None:
        object.__setattr__(self, "_mgr", mgr)
        object.__setattr__(self, "attn_dp_rank", rank)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mgr, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._mgr, name, value)


def around_sender_init(original: Any, sender: Any, mgr: Any, *args: Any, **kwargs: Any) -> None:
    rank = bootstrap_dp_rank(
        mgr.attn_dp_rank,
        getattr(mgr, "system_dp_size", None),
        getattr(mgr, "system_dp_rank", None),
    )
    if rank == mgr.attn_dp_rank:
        original(sender, mgr, *args, **kwargs)
        return
    try:
        original(sender, _BootstrapRankView(mgr, rank), *args, **kwargs)
    finally:
        sender.kv_mgr = mgr


def prefill_node(server_args: Any) -> bool:
    """Whether this launch's schedulers build prefill senders."""
    return getattr(server_args, "disaggregation_mode", None) == "prefill"


HOOKS = (Hook(SENDER_INIT, around_sender_init, "AROUND"),)
