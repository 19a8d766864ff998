"""Real KV events from real requests: prompts, receiving a node's batches, decoding them.

A prompt pinned to a DP rank (SGLang's ``routed_dp_rank``) runs on that rank's real scheduler;
its radix cache stores the prompt's full pages and the rank's ``ZmqEventPublisher`` sends
``BlockStored`` events stamped with the rank. Batches are decoded with SGLang's own msgspec
types (``sglang.srt.disaggregation.kv_events``).
"""

from __future__ import annotations

import itertools
from typing import Any

from overlay_harness import probes
from overlay_harness.group import PAGE_SIZE
from overlay_harness.nodes import Node

PROMPT_TOKENS = 96  # six pages of 16
LIVE_ATTEMPTS = 10
# Token ids below this are left alone (special ids of the tiny model's config).
FIRST_TOKEN = 3
VOCAB = 512

_prompt_counter = itertools.count()


def prompt(length: int = PROMPT_TOKENS) -> list[int]:
    """A prompt no earlier prompt of this process shares a page with: its first token differs."""
    index = next(_prompt_counter)
    span = VOCAB - FIRST_TOKEN
    return [FIRST_TOKEN + (index * 7 + offset * 13) % span for offset in range(length)]


def decode(payload_hex: str) -> Any:
    """One batch's ``KVEventBatch``."""
    import msgspec
    from sglang.srt.disaggregation.kv_events import KVEventBatch

    return msgspec.msgpack.Decoder(KVEventBatch).decode(bytes.fromhex(payload_hex))


def stored_pages(batches: list[Any]) -> list[tuple[list[int], int]]:
    """``(token ids, block size)`` of every page stored in ``batches``, in order."""
    from sglang.srt.disaggregation.kv_events import BlockStored

    pages = []
    for batch in batches:
        for event in batch.events:
            if isinstance(event, BlockStored):
                size = event.block_size
                tokens = list(event.token_ids)
                pages.extend((tokens[i : i + size], size) for i in range(0, len(tokens), size))
    return pages


def stored_prompt_pages(prompt: list[int], new_tokens: int) -> list[list[int]]:
    """The prompt's pages a radix cache holds once a request for it generated ``new_tokens``:
    every full page of the request's sequence but its last token (never cached)."""
    cached = min(len(prompt), len(prompt) + new_tokens - 1) // PAGE_SIZE * PAGE_SIZE
    return [prompt[i : i + PAGE_SIZE] for i in range(0, cached, PAGE_SIZE)]


def reused_tokens(prompt: list[int]) -> int:
    """Cached tokens SGLang reports when ``prompt`` comes again: whole pages, short of its
    last token, which it always recomputes."""
    return (len(prompt) - 1) // PAGE_SIZE * PAGE_SIZE


def receive_live_batch(owner: Node, source: dict, leader: Node, seconds: float = 120.0) -> list:
    """``[seq, payload hex]`` of a live batch a subscriber on ``owner`` (the source's node)
    receives through the advertised endpoint, while fresh prompts pinned to the source's rank
    are sent to ``leader`` until one arrives (a SUB socket joins asynchronously)."""
    with owner.stream(probes.kv_batches, source["endpoint"], source["topic"], seconds) as batches:
        if batches.next_item(timeout=60) != "subscribed":
            raise AssertionError(f"no subscription to {source['endpoint']}")
        for _ in range(LIVE_ATTEMPTS):
            leader.generate(prompt(), 1, source["dp_rank"])
            try:
                return batches.next_item(timeout=10)
            except AssertionError:
                continue
    raise AssertionError(f"no live batch from {source['endpoint']} on {owner.name}")
