"""contract.events: the sequence frame, the replay end marker and the event batch as SGLang's
publisher writes them (``[ts, events, rank]``; events tagged arrays before 0.5.21, tagged maps
from 0.5.21 on)."""

from __future__ import annotations

import msgspec
import pytest
from sglang_sidecar_overlay.contract.events import (
    REPLAY_END_SEQ,
    SEQ_BYTES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEventBatch,
    decode_seq,
    encode_seq,
)


def test_sequence_frames_are_8_byte_big_endian_and_the_end_marker_is_minus_one() -> None:
    assert encode_seq(REPLAY_END_SEQ) == b"\xff" * SEQ_BYTES
    assert encode_seq(1) == b"\x00" * 7 + b"\x01"
    for seq in (0, 1, 2**32, 2**63 - 1, REPLAY_END_SEQ):
        assert decode_seq(encode_seq(seq)) == seq
    assert decode_seq(b"\x00" * 4) is None


def test_a_batch_is_the_positional_array_sglangs_publisher_writes() -> None:
    batch = KVEventBatch(
        1.5,
        [BlockStored([7], None, [1, 2], 2, None), BlockRemoved([7]), AllBlocksCleared()],
        3,
    )
    expected = [1.5, [["BlockStored", [7], None, [1, 2], 2, None], ["BlockRemoved", [7]],
                      ["AllBlocksCleared"]], 3]  # fmt: skip
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(batch)) == expected
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=KVEventBatch) == batch


@pytest.mark.parametrize(
    "event",
    [
        # 0.5.19/0.5.20: a tagged array, with the trailing medium.
        ["BlockStored", [7], None, [1, 2], 2, None, "GPU"],
        # 0.5.21+: a tagged map.
        {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
         "token_ids": [1, 2], "block_size": 2, "lora_id": None},
    ],
)  # fmt: skip
def test_the_batch_envelope_reads_every_releases_events(event: object) -> None:
    for rank in (0, None):
        payload = msgspec.msgpack.encode([2.0, [event], rank])
        assert msgspec.msgpack.decode(payload, type=EventBatch) == EventBatch(2.0, [event], rank)
    unstamped = msgspec.msgpack.decode(msgspec.msgpack.encode([2.0, [event]]), type=EventBatch)
    assert unstamped.dp_rank is None


def test_array_events_of_0_5_19_decode_with_their_trailing_fields_ignored() -> None:
    payload = msgspec.msgpack.encode([0.0, [["BlockStored", [7], 5, [1], 1, None, "GPU"]], 0])
    (event,) = msgspec.msgpack.decode(payload, type=KVEventBatch).events
    assert event == BlockStored([7], 5, [1], 1, None)
