"""Publisher read-back, in a scheduler process: what its KV-event publisher really bound.

SGLang's ``ZmqEventPublisher`` binds (or connects) its PUB and replay ROUTER sockets in the
scheduler process; right after, in the thread that created them, the publisher hook reads
back the bound endpoints (ZMQ ``LAST_ENDPOINT``), and the ready message describes them as the
scheduler's ``kv_event_sources`` through the core (``contract.sources.describe_source``), with
the bounds the publisher enforces (its replay buffer, high-water mark and queue).
"""

from __future__ import annotations

from typing import Any

from sglang_sidecar_overlay.adapters import _sglang
from sglang_sidecar_overlay.contract.endpoints import is_bind_endpoint
from sglang_sidecar_overlay.contract.sources import describe_source
from sglang_sidecar_overlay.contract.values import is_int

# Attributes the publisher hook sets on a ZmqEventPublisher (a plain class, not slotted).
PUB_ENDPOINT_ATTR = "_sidecar_overlay_pub_endpoint"
REPLAY_ENDPOINT_ATTR = "_sidecar_overlay_replay_endpoint"


def record_bound_endpoints(publisher: Any) -> None:
    """Read back what the publisher's sockets bound to, in the thread that created them."""
    import zmq

    pub = getattr(publisher, "_pub", None)
    endpoint = getattr(publisher, "_endpoint", "") or ""
    bound = None
    if pub is not None and is_bind_endpoint(endpoint):
        bound = pub.getsockopt_string(zmq.LAST_ENDPOINT)
    setattr(publisher, PUB_ENDPOINT_ATTR, bound)
    replay = getattr(publisher, "_replay", None)
    setattr(
        publisher,
        REPLAY_ENDPOINT_ATTR,
        replay.getsockopt_string(zmq.LAST_ENDPOINT) if replay is not None else None,
    )


def publisher_sources(kv_publisher: Any, block_size: int) -> list[dict[str, Any]]:
    """``[source]`` for a scheduler's bound ZMQ publisher, ``[]`` for none or connect-style."""
    publisher = getattr(kv_publisher, "kv_event_publisher", None)
    if publisher is None:
        return []
    topic_bytes = getattr(publisher, "_topic_bytes", b"")
    source = describe_source(
        int(publisher._dp_rank),
        getattr(publisher, PUB_ENDPOINT_ATTR, None),
        topic_bytes.decode("utf-8"),
        block_size,
        getattr(publisher, REPLAY_ENDPOINT_ATTR, None),
        bounds=publisher_bounds(publisher),
    )
    return [source] if source is not None else []


def publisher_bounds(publisher: Any) -> dict[str, int]:
    """The bounds a live ``ZmqEventPublisher`` enforces, read from the objects enforcing them.

    Its replay buffer (a ``deque``'s ``maxlen``), its PUB high-water mark and its publish
    queue (a ``Queue``'s ``maxsize``); ZMQ and ``Queue`` read 0 and below as no bound, which
    is reported as 0. What the publisher does not have is left out.
    """
    bounds: dict[str, int] = {}
    maxlen = getattr(getattr(publisher, "_buffer", None), "maxlen", None)
    if is_int(maxlen):
        bounds["replay_buffer_steps"] = max(maxlen, 0)
    hwm = getattr(publisher, "_hwm", None)
    if is_int(hwm):
        bounds["hwm"] = max(hwm, 0)
    maxsize = getattr(getattr(publisher, "_event_queue", None), "maxsize", None)
    if is_int(maxsize):
        bounds["max_queue_size"] = max(maxsize, 0)
    return bounds


def scheduler_block_size(scheduler: Any) -> int:
    """page_size × dcp_size, the size a router must hash with."""
    return int(scheduler.page_size) * _sglang.dcp_size()
