"""SGLang's KV-event stream on the wire: the event batch, the events, the sequence frame and the
replay end marker. The one place the package writes them: the selftest's stand-in publisher
sends with these, and the probe reads with them.

A live message is three frames, ``[topic, seq, payload]``: ``seq`` is an 8-byte big-endian
sequence number (``encode_seq``) and ``payload`` a msgpack ``EventBatch``. A subscriber asks
the publisher's replay ROUTER for its history with one frame, the start sequence; the replies
are ``[topic, seq, payload]`` from SGLang 0.5.22 on and ``[seq, payload]`` before, and the
replay ends with the sequence ``REPLAY_END_SEQ`` (-1, signed: eight 0xff bytes) and an empty
payload.

The batch is a positional array ``[ts, events, dp_rank]`` in every supported release (SGLang
calls the rank ``attn_dp_rank``; it is the contract's ``dp_rank``, the global KV-publisher
rank). The events are tagged: SGLang 0.5.19 and 0.5.20 write each one as an array whose first
item is the class name (the shape below, vLLM's too), 0.5.21 and later as a map whose
``type`` key holds it. A reader that must accept every release reads the batch with
``EventBatch`` (events left undecoded); ``KVEventBatch`` decodes the array-shaped events.

Pure: nothing here imports SGLang.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "REPLAY_END_SEQ",
    "SEQ_BYTES",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVCacheEvent",
    "KVEventBatch",
    "decode_seq",
    "encode_seq",
]

SEQ_BYTES = 8
REPLAY_END_SEQ = -1


def encode_seq(seq: int) -> bytes:
    """A sequence-number frame; ``REPLAY_END_SEQ`` encodes as eight 0xff bytes."""
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


def decode_seq(raw: bytes) -> int | None:
    """The sequence number of a frame, or None when the frame is not 8 bytes."""
    if len(raw) != SEQ_BYTES:
        return None
    return int.from_bytes(raw, "big", signed=True)


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    """``[ts, events, dp_rank]``; a batch without a rank stamp is two items long."""

    ts: float
    events: list[Any]
    dp_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
    """An event as an array tagged with its class name: ``["BlockStored", ...]``.

    Only the fields every release writes are here: items a release appends after them
    (``medium`` from 0.5.19 on) are ignored when read, and never written.
    """


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    """An ``EventBatch`` whose events are decoded (the array-shaped ones)."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
