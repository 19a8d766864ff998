"""Subscribe to every advertised publisher like a router would, and ask each replay endpoint
for its history: count batches, events, sequence gaps and rank stamps per rank.

The frames and the batch are read with ``contract.events``, which the selftest's stand-in
publisher sends with.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from sglang_sidecar_overlay.contract.events import (
    REPLAY_END_SEQ,
    EventBatch,
    decode_seq,
    encode_seq,
)
from sglang_sidecar_overlay.contract.values import is_int
from sglang_sidecar_overlay.tools.probe.report import (
    INFO,
    OK,
    CheckFindings,
    Finding,
    RankTraffic,
    horizon_warning,
)

__all__ = ["Subscriptions", "listen", "traffic_findings"]


def _reject(traffic: RankTraffic, reason: str) -> None:
    """Count a message that does not follow SGLang's wire format, keeping the latest reason."""
    traffic.bad_messages += 1
    traffic.last_bad = reason


def _record_batch(traffic: RankTraffic, seq: int, payload: bytes, *, replay: bool) -> None:
    try:
        batch = msgspec.msgpack.decode(payload, type=EventBatch)
    except msgspec.ValidationError as exc:
        _reject(traffic, f"payload is not an event batch [ts, events, rank]: {exc}")
        return
    except msgspec.DecodeError as exc:
        _reject(traffic, f"payload is not msgpack: {exc}")
        return
    events = len(batch.events)
    if replay:
        traffic.replay_batches += 1
        traffic.replay_events += events
    else:
        traffic.batches += 1
        traffic.events += events
        last = traffic._last_live_seq
        if last is not None and seq <= last:
            # Numbering started over: the publisher was restarted.
            traffic.seq_resets += 1
        elif last is not None and seq != last + 1:
            traffic.seq_gaps += 1
            traffic.widest_gap = max(traffic.widest_gap, seq - last - 1)
        traffic._last_live_seq = seq
    if traffic.highest_seq is None or seq > traffic.highest_seq:
        traffic.highest_seq = seq
    if batch.dp_rank is None:
        traffic.unstamped_batches += 1
    else:
        traffic.stamped_ranks.add(batch.dp_rank)


def _on_live(traffic: RankTraffic, frames: list[bytes]) -> None:
    if len(frames) != 3:
        _reject(traffic, f"live message has {len(frames)} frames, expected 3")
        return
    topic, seq_raw, payload = frames
    if topic != traffic.topic.encode("utf-8"):
        # SUB filters by prefix; a longer topic sharing the prefix is someone else's.
        traffic.other_topics += 1
        return
    seq = decode_seq(seq_raw)
    if seq is None:
        _reject(traffic, "sequence frame is not 8 bytes")
        return
    _record_batch(traffic, seq, payload, replay=False)


def _on_replay(traffic: RankTraffic, frames: list[bytes]) -> None:
    # DEALER sees the ROUTER's empty delimiter, then (seq, payload) before SGLang 0.5.22 or
    # (topic, seq, payload) from 0.5.22 on; seq -1 ends the replay.
    if frames and frames[0] == b"":
        frames = frames[1:]
    if len(frames) == 3:
        seq_raw, payload = frames[1], frames[2]
    elif len(frames) == 2:
        seq_raw, payload = frames
    else:
        _reject(traffic, f"replay message has {len(frames)} frames")
        return
    seq = decode_seq(seq_raw)
    if seq is None:
        _reject(traffic, "replay sequence frame is not 8 bytes")
        return
    if seq == REPLAY_END_SEQ:
        traffic.replay = "complete"
        return
    _record_batch(traffic, seq, payload, replay=True)


def _replay_buffer_steps(source: Mapping[str, Any]) -> int | None:
    """The source's advertised replay horizon, when it is a usable count."""
    steps = source.get("replay_buffer_steps")
    return steps if is_int(steps) else None


class Subscriptions:
    """Live SUB sockets (and a replay request from seq 0) on every source, polled on demand.

    ``listen`` runs one for a fixed window; ``probe --watch`` keeps one per node open and
    reads the counters in between polls.
    """

    def __init__(self, sources: Sequence[Mapping[str, Any]]) -> None:
        import zmq

        self.traffic = [
            RankTraffic(
                index=index,
                dp_rank=source.get("dp_rank"),
                endpoint=str(source.get("endpoint")),
                topic=str(source.get("topic") or ""),
                replay_endpoint=source.get("replay_endpoint"),
                replay_buffer_steps=_replay_buffer_steps(source),
            )
            for index, source in enumerate(sources)
        ]
        self._context = zmq.Context()
        self._sockets: list[Any] = []
        self._handlers: dict[
            Any, tuple[RankTraffic, Callable[[RankTraffic, list[bytes]], None]]
        ] = {}
        self._poller = zmq.Poller()
        try:
            for item in self.traffic:
                self._subscribe(item)
        except BaseException:
            self.close()
            raise

    def _subscribe(self, item: RankTraffic) -> None:
        import zmq

        sub = self._context.socket(zmq.SUB)
        self._sockets.append(sub)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, item.topic.encode("utf-8"))
        try:
            sub.connect(item.endpoint)
        except zmq.ZMQError as exc:
            _reject(item, f"cannot subscribe to {item.endpoint}: {exc}")
            return
        self._poller.register(sub, zmq.POLLIN)
        self._handlers[sub] = (item, _on_live)
        if item.replay_endpoint:
            dealer = self._context.socket(zmq.DEALER)
            self._sockets.append(dealer)
            dealer.setsockopt(zmq.LINGER, 0)
            try:
                dealer.connect(item.replay_endpoint)
            except zmq.ZMQError as exc:
                _reject(item, f"cannot connect to {item.replay_endpoint}: {exc}")
                return
            # The ROUTER expects [identity, "", start_seq]; DEALER adds no delimiter.
            dealer.send_multipart([b"", encode_seq(0)])
            item.replay = "requested"
            self._poller.register(dealer, zmq.POLLIN)
            self._handlers[dealer] = (item, _on_replay)

    @property
    def active(self) -> bool:
        """Whether any socket is being polled (an empty poller returns at once)."""
        return bool(self._handlers)

    def poll(self, seconds: float) -> None:
        """Handle whatever arrives within ``seconds`` (at least one poll)."""
        import zmq

        if not self._handlers:
            return
        for sock, _event in self._poller.poll(timeout=int(max(0.0, seconds) * 1000)):
            item, handler = self._handlers[sock]
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                handler(item, frames)

    def close(self) -> None:
        for sock in self._sockets:
            sock.close(linger=0)
        self._sockets.clear()
        self._handlers.clear()
        self._context.term()


def listen(
    sources: Sequence[Mapping[str, Any]],
    seconds: float,
    *,
    until: Callable[[list[RankTraffic]], bool] | None = None,
) -> list[RankTraffic]:
    """Subscribe to every source (and request replay from 0) for ``seconds``.

    ``until`` may end the window early once it returns True (the selftest uses it so it
    does not wait out a fixed window once everything it needs has arrived).
    """
    subscriptions = Subscriptions(sources)
    try:
        deadline = time.monotonic() + max(0.0, seconds)
        # Nothing to poll: an empty poller returns at once and would spin until the deadline.
        while subscriptions.active:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (until is not None and until(subscriptions.traffic)):
                break
            subscriptions.poll(min(remaining, 0.1))
    finally:
        subscriptions.close()
    return subscriptions.traffic


def traffic_findings(traffic: Sequence[RankTraffic], seconds: float) -> list[Finding]:
    """One check per advertised rank: an OK summary line when nothing is wrong, else an INFO
    summary line followed by the problems, each naming the source's field."""
    found: list[Finding] = []
    for item in traffic:
        rank = _rank_problems(item, seconds)
        summary = (
            f"{item.batches} batches / {item.events} events live, "
            f"{item.replay_batches} batches / {item.replay_events} events replayed, "
            f"highest seq {item.highest_seq if item.highest_seq is not None else '-'}"
        )
        # The summary line names the rank, not a field: problems below carry the fields.
        line = CheckFindings(rank.check)
        if not rank.found:
            stamp = "stamped rank matches" if item.rank_matches else "no rank stamp seen"
            line.add(OK, None, f"{summary}, {stamp}")
        else:
            line.add(INFO, None, summary)
        found += line.found + rank.found
    return found


def _rank_problems(item: RankTraffic, seconds: float) -> CheckFindings:
    rank = CheckFindings(f"rank {item.dp_rank}")
    source = ("kv_event_sources", item.index)
    if item.rank_matches is False:
        stamped = sorted(item.stamped_ranks)
        rank.error(
            (*source, "dp_rank"),
            f"batches are stamped with rank(s) {stamped}, advertised {item.dp_rank}",
        )
    if item.bad_messages:
        rank.error(
            (*source, "endpoint"), f"{item.bad_messages} undecodable message(s): {item.last_bad}"
        )
    if item.replay == "requested":
        rank.error(
            (*source, "replay_endpoint"),
            f"no complete replay from {item.replay_endpoint} within {seconds:g}s",
        )
    if item.batches + item.replay_batches == 0:
        rank.warning(source, f"no events within {seconds:g}s (idle publisher?)")
    if item.unstamped_batches:
        rank.warning(
            (*source, "dp_rank"), f"{item.unstamped_batches} batch(es) carry no rank stamp"
        )
    if item.seq_gaps:
        rank.warning(source, f"{item.seq_gaps} gap(s) in live sequence numbers")
    if item.beyond_replay_horizon:
        rank.warning(source, horizon_warning(item))
    if item.seq_resets:
        rank.warning(
            source,
            f"live sequence numbers started over {item.seq_resets} time(s) (publisher restarted)",
        )
    return rank
