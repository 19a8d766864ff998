"""``selftest``: prove on this machine, without a GPU, that the install serves the contract.

What runs, all inside this process and on loopback:

1. two stand-in KV-event publishers bind a PUB and a replay ROUTER socket each, the way an
   SGLang scheduler's ``ZmqEventPublisher`` does (wildcard TCP bind, port read back from
   ``LAST_ENDPOINT``, replay framing of SGLang 0.5.22+);
2. the core builder (``contract.sources`` + ``contract.server_info``) turns them into the
   server info of a follower node (node_rank 1 of 2, attention-DP 4, this node owning ranks 2
   and 3);
3. the native metadata server serves that snapshot with grpc.health.v1;
4. ``probe`` runs against it, listening while the publishers publish, exactly as an
   operator's ``probe --listen`` would;
5. health and shutdown are checked: NOT_SERVING when told so, the port released on stop.

Everything is torn down before ``run_selftest`` returns, whatever failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from sglang_sidecar_overlay.contract.events import (
    REPLAY_END_SEQ,
    BlockStored,
    KVEventBatch,
    decode_seq,
    encode_seq,
)
from sglang_sidecar_overlay.contract.incarnation import Incarnation
from sglang_sidecar_overlay.tools import probe
from sglang_sidecar_overlay.tools.probe.checks import describe_incarnation
from sglang_sidecar_overlay.tools.probe.report import finding_lines
from sglang_sidecar_overlay.tools.report import Report, print_lines

logger = logging.getLogger(__name__)

__all__ = ["Check", "SelftestReport", "StandInPublisher", "run_selftest"]

LOCAL_RANKS = (2, 3)
# The simulated group's leader (node_rank 0), for the group check.
LEADER_RANKS = (0, 1)
TOPIC = "kv-selftest"
PAGE_SIZE = 16
DCP_SIZE = 1
SECRET = "selftest-secret-value"
_HISTORY_BATCHES = 3


@dataclasses.dataclass
class Check:
    """One selftest step: its name, whether it passed, and what was seen."""

    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class SelftestReport(Report):
    """All steps in order plus the probe report of step 4."""

    checks: list[Check] = dataclasses.field(default_factory=list)
    probe: probe.ProbeReport | None = None
    target: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(check.ok for check in self.checks)

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(name, ok, detail))
        return ok

    def to_json(self) -> dict[str, Any]:
        """The stable ``selftest --json`` object (documented in the operator guide)."""
        return {
            "ok": self.ok,
            "target": self.target,
            "checks": [check.to_json() for check in self.checks],
            "probe": None if self.probe is None else self.probe.to_json(),
        }

    def render(self, out: TextIO) -> None:
        """A line per check, the probe's own lines, then ``PASS (n/m checks passed)``."""
        print(
            "selftest: follower metadata server fed by stand-in publishers "
            f"(ranks {', '.join(str(rank) for rank in LOCAL_RANKS)}), no GPU",
            file=out,
        )
        print_lines([("ok" if c.ok else "error", c.name, c.detail) for c in self.checks], out)
        if self.probe is not None and self.probe.error is None:
            print(f"probe {self.target}:", file=out)
            print_lines(finding_lines(self.probe.findings), out, indent="    ")
        passed = sum(1 for check in self.checks if check.ok)
        word = "PASS" if self.ok else "FAIL"
        print(f"{word} ({passed}/{len(self.checks)} checks passed)", file=out)


class StandInPublisher:
    """A KV-event publisher that binds and frames like SGLang's ``ZmqEventPublisher``.

    Sockets are created and bound in the constructing thread (where SGLang reads
    ``LAST_ENDPOINT``) and used only by the publisher thread afterwards.
    """

    def __init__(
        self,
        context: Any,
        dp_rank: int,
        *,
        endpoint: str = "tcp://*:0",
        replay_endpoint: str | None = "tcp://*:0",
        topic: str = TOPIC,
        stamp_rank: int | None = None,
    ) -> None:
        import zmq

        self.dp_rank = dp_rank
        self.topic = topic
        # A deliberately wrong stamp lets tests exercise the rank check.
        self.stamp_rank = dp_rank if stamp_rank is None else stamp_rank
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue()
        self._buffer: list[tuple[int, bytes]] = []
        self._published = 0
        self._published_lock = threading.Lock()
        self._pub = context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay = None
        try:
            self._pub.bind(endpoint)
            self.bound_endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
            self.bound_replay_endpoint: str | None = None
            if replay_endpoint is not None:
                self._replay = context.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(replay_endpoint)
                self.bound_replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException:
            self._close_sockets()
            raise
        self._thread = threading.Thread(
            target=self._run, name=f"stand-in-publisher-{dp_rank}", daemon=True
        )
        self._thread.start()

    @property
    def published(self) -> int:
        with self._published_lock:
            return self._published

    def publish(self, block_hashes: list[int]) -> None:
        """Queue one batch with a single BlockStored event for ``block_hashes``."""
        event = BlockStored(block_hashes, None, list(range(PAGE_SIZE)), PAGE_SIZE, None)
        self._queue.put(KVEventBatch(time.time(), [event], self.stamp_rank))

    def close(self) -> None:
        """Stop the thread, then close the sockets it owned."""
        self._queue.put(None)
        self._thread.join(timeout=5)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _run(self) -> None:
        import msgspec
        import zmq

        encoder = msgspec.msgpack.Encoder()
        topic = self.topic.encode("utf-8")
        seq = 0
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay(topic)
            try:
                batch = self._queue.get(timeout=0.01)
            except queue.Empty:
                continue
            if batch is None:
                return
            payload = encoder.encode(batch)
            try:
                self._pub.send_multipart([topic, encode_seq(seq), payload])
            except zmq.ZMQError:
                logger.exception("stand-in publisher %d failed to publish", self.dp_rank)
                return
            self._buffer.append((seq, payload))
            seq += 1
            with self._published_lock:
                self._published = seq

    def _serve_replay(self, topic: bytes) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            logger.warning("stand-in publisher %d: bad replay request", self.dp_rank)
            return
        identity, _, start = frames
        start_seq = decode_seq(start) or 0
        for seq, payload in self._buffer:
            if seq >= start_seq:
                self._replay.send_multipart([identity, b"", topic, encode_seq(seq), payload])
        self._replay.send_multipart([identity, b"", b"", encode_seq(REPLAY_END_SEQ), b""])


def _wait_for(condition: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return bool(condition())


def node_snapshot(
    publishers: list[StandInPublisher],
    *,
    legacy_dp_size: bool,
    incarnation: Incarnation | None = None,
    node_rank: int = 1,
) -> dict[str, Any]:
    """The server info of a simulated node (the follower by default), through the core builder.

    ``incarnation`` is the simulated launch; a fresh one when not given.
    """
    from sglang_sidecar_overlay.contract.server_info import build_server_info
    from sglang_sidecar_overlay.contract.sources import describe_source

    block_size = PAGE_SIZE * DCP_SIZE
    sources = [
        describe_source(
            pub.dp_rank, pub.bound_endpoint, pub.topic, block_size, pub.bound_replay_endpoint
        )
        for pub in publishers
    ]
    launch_command = (
        "python -m sglang.launch_server --model-path selftest/stand-in --nnodes 2 "
        f"--node-rank 1 --tp 4 --dp 4 --enable-dp-attention --api-key {SECRET}"
    )
    return build_server_info(
        _server_args(node_rank),
        _scheduler_info(),
        incarnation=Incarnation.new() if incarnation is None else incarnation,
        launch_command=launch_command,
        kv_events=_kv_events(publishers[0], block_size),
        kv_event_sources=[source for source in sources if source is not None],
        legacy_dp_size=legacy_dp_size,
    )


def _scheduler_info() -> dict[str, Any]:
    """What the simulated node's schedulers report once ready (this process stands in)."""
    return {
        "status": "ready",
        "max_total_num_tokens": 65536,
        "max_req_input_len": 8192,
        "startup_time": 0.0,
        "scheduler_pids": [os.getpid()],
    }


def _server_args(node_rank: int) -> dict[str, Any]:
    """The simulated launch: 2 nodes, TP 4, attention-DP 4, wildcard KV-event binds."""
    kv_events_config = {
        "publisher": "zmq",
        "endpoint": "tcp://*:0",
        "replay_endpoint": "tcp://*:0",
        "topic": TOPIC,
    }
    return {
        "model_path": "selftest/stand-in",
        "host": "127.0.0.1",
        "grpc_port": 0,
        "nnodes": 2,
        "node_rank": node_rank,
        "dist_init_addr": "127.0.0.1:5000",
        "tp_size": 4,
        "dp_size": 1,
        "attn_dp_size": 4,
        "page_size": PAGE_SIZE,
        "dcp_size": DCP_SIZE,
        "disaggregation_mode": "null",
        "kv_events_config": json.dumps(kv_events_config),
        "api_key": SECRET,
    }


def _kv_events(first: StandInPublisher, block_size: int) -> dict[str, Any]:
    """The node's ``kv_events`` summary. Ephemeral ports are not base + rank; only block_size
    and dp_size are meaningful here."""
    first_port = int(first.bound_endpoint.rsplit(":", 1)[1])
    return {
        "publisher": "zmq",
        "endpoint_host": "*",
        "endpoint_port_base": first_port - first.dp_rank,
        "topic": TOPIC,
        "block_size": block_size,
        "dp_size": 4,
    }


@contextlib.contextmanager
def _publishers(
    context: Any, ranks: tuple[int, ...] = LOCAL_RANKS
) -> Iterator[list[StandInPublisher]]:
    publishers: list[StandInPublisher] = []
    try:
        for rank in ranks:
            publishers.append(StandInPublisher(context, rank))
        yield publishers
    finally:
        for pub in publishers:
            pub.close()


@contextlib.contextmanager
def _feeding(publishers: list[StandInPublisher], interval: float = 0.05) -> Iterator[None]:
    """Publish one batch per rank every ``interval`` until the block exits."""
    stop = threading.Event()

    def feed() -> None:
        block = 1000
        while not stop.wait(interval):
            for pub in publishers:
                pub.publish([block + pub.dp_rank])
            block += 10

    thread = threading.Thread(target=feed, name="selftest-feeder", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def run_selftest(*, host: str = "127.0.0.1", listen_timeout: float = 10.0) -> SelftestReport:
    """Run every step; a failed step is recorded and the later ones that need it skipped."""
    import zmq

    report = SelftestReport()
    try:
        from sglang_sidecar_overlay import _native
    except ImportError as exc:
        report.add("native module", False, f"cannot import sglang_sidecar_overlay._native: {exc}")
        return report
    build = _native.build_info()
    report.add(
        "native module",
        True,
        f"{_native.__version__} ({build.get('profile')}, {build.get('target')})",
    )
    context = zmq.Context()
    try:
        with _publishers(context) as publishers:
            _run_steps(report, _native, context, publishers, host, listen_timeout)
    except (OSError, zmq.ZMQError) as exc:
        report.add("sockets", False, f"could not bind on {host}: {exc}")
    except Exception as exc:
        # A selftest reports; the traceback is for -v, not for the operator's screen.
        logger.debug("selftest step failed", exc_info=True)
        report.add("unexpected error", False, f"{type(exc).__name__}: {exc}")
    finally:
        context.term()
    return report


def _run_steps(
    report: SelftestReport,
    native: Any,
    context: Any,
    publishers: list[StandInPublisher],
    host: str,
    listen_timeout: float,
) -> None:
    described = ", ".join(
        f"rank {pub.dp_rank} {pub.bound_endpoint} (replay {pub.bound_replay_endpoint})"
        for pub in publishers
    )
    report.add("publishers bound", True, described)
    built = _build_step(report, publishers)
    if built is None:
        return
    info, text, legacy = built
    _history_step(report, publishers)
    with native.start_metadata_server(host, 0, text) as server:
        target = probe.grpc_target(server.host, server.port)
        report.target = target
        server.set_serving(True)
        report.add("metadata server", server.is_alive(), f"serving on {target}")
        _probe_step(report, publishers, target, info, listen_timeout)
        _group_step(report, native, context, target, host, legacy)
        _health_and_shutdown_steps(report, server, target)


def _build_step(
    report: SelftestReport, publishers: list[StandInPublisher]
) -> tuple[dict[str, Any], str, bool] | None:
    """Build the follower's server info; (info, its JSON text, legacy dp_size) or None."""
    from sglang_sidecar_overlay.contract.server_info import (
        legacy_dp_size_enabled,
        render_server_info,
    )

    try:
        legacy = legacy_dp_size_enabled()
    except ValueError as exc:
        report.add("server info built", False, str(exc))
        return None
    launch = Incarnation.new()
    info = node_snapshot(publishers, legacy_dp_size=legacy, incarnation=launch)
    text = render_server_info(info)
    advertised = [source["endpoint"] for source in info["kv_event_sources"]]
    ports_ok = [ep.rsplit(":", 1)[1] for ep in advertised] == [
        pub.bound_endpoint.rsplit(":", 1)[1] for pub in publishers
    ]
    loopback = all(ep.startswith("tcp://127.0.0.1:") for ep in advertised)
    if not report.add(
        "server info built",
        ports_ok and loopback,
        f"{len(text)} bytes, sources {advertised} (wildcard binds advertised on loopback)",
    ):
        return None
    report.add(
        "incarnation",
        info.get("incarnation") == launch.to_json(),
        f"contract v{info.get('contract_version')}, {describe_incarnation(info)}",
    )
    report.add(
        "secrets redacted",
        SECRET not in text,
        "api_key and --api-key hidden" if SECRET not in text else "the API key leaked",
    )
    return info, text, legacy


def _history_step(report: SelftestReport, publishers: list[StandInPublisher]) -> None:
    """History the probe must get back through replay, published before it subscribes."""
    for pub in publishers:
        for index in range(_HISTORY_BATCHES):
            pub.publish([index * 100 + pub.dp_rank])
    history_ok = _wait_for(
        lambda: all(pub.published >= _HISTORY_BATCHES for pub in publishers), timeout=5
    )
    report.add("history published", history_ok, f"{_HISTORY_BATCHES} batches per rank")


def _health_and_shutdown_steps(report: SelftestReport, server: Any, target: str) -> None:
    """Health follows set_serving(False); shutdown stops the server and releases the port."""
    server.set_serving(False)
    health = probe.read_health(target, timeout=5)
    report.add(
        "health follows schedulers",
        health["status"] == "NOT_SERVING",
        f"after set_serving(False): {health['status']}",
    )
    server.shutdown()
    stopped = _wait_for(lambda: not server.is_alive(), timeout=5)
    try:
        probe.fetch_server_info(target, timeout=2)
        released = False
        detail = "still answering after shutdown"
    except probe.ProbeError as exc:
        released = exc.kind == "unreachable"
        detail = f"after shutdown: {exc.kind}"
    report.add("shutdown", stopped and released, detail)


def _group_step(
    report: SelftestReport,
    native: Any,
    context: Any,
    follower_target: str,
    host: str,
    legacy: bool,
) -> None:
    """Serve the group's leader too, then check both nodes as one group (``probe --group``)."""
    from sglang_sidecar_overlay.contract.server_info import render_server_info
    from sglang_sidecar_overlay.tools.probe.group import run_group_probe

    with _publishers(context, LEADER_RANKS) as leader_publishers:
        info = node_snapshot(leader_publishers, legacy_dp_size=legacy, node_rank=0)
        with native.start_metadata_server(host, 0, render_server_info(info)) as server:
            server.set_serving(True)
            leader_target = probe.grpc_target(server.host, server.port)
            # Follower first: the group check takes the nodes in any order.
            result = run_group_probe([follower_target, leader_target], timeout=5)
    problems = [f"{f.field}: {f.message}" for f in result.findings if f.level == probe.ERROR]
    for node in result.nodes:
        if not node.ok:
            problems.append(f"{node.target} fails its own probe")
    by_node: dict[Any, list[str]] = {}
    for rank, owners in sorted(result.owners.items()):
        for node_rank, _target in owners:
            by_node.setdefault(node_rank, []).append(str(rank))
    ranks = "; ".join(
        f"{','.join(ranks)} on node_rank {node}" for node, ranks in sorted(by_node.items())
    )
    report.add(
        "group check",
        result.ok,
        f"leader {leader_target} + follower {follower_target}: ranks {ranks}"
        if result.ok
        else "; ".join(problems),
    )


def _probe_step(
    report: SelftestReport,
    publishers: list[StandInPublisher],
    target: str,
    info: dict[str, Any],
    listen_timeout: float,
) -> None:
    def enough(traffic: list[probe.RankTraffic]) -> bool:
        return all(
            item.replay == "complete" and item.batches >= _HISTORY_BATCHES for item in traffic
        )

    with _feeding(publishers):
        result = probe.run_probe(target, timeout=5, listen_seconds=listen_timeout, until=enough)
    report.probe = result
    if result.error is not None:
        report.add("probe", False, result.error.message)
        return
    errors = [f"{f.field}: {f.message}" for f in result.findings if f.level == probe.ERROR]
    report.add(
        "probe",
        result.ok,
        "contract holds" if result.ok else "; ".join(errors),
    )
    report.add(
        "served snapshot",
        result.server_info == info,
        "GetServerInfo returns the built snapshot"
        if result.server_info == info
        else "GetServerInfo differs from the built snapshot",
    )
    for item in result.traffic:
        ok = (
            item.replay == "complete"
            and item.replay_batches >= _HISTORY_BATCHES
            and item.batches >= 1
            and item.rank_matches is True
        )
        report.add(
            f"events rank {item.dp_rank}",
            ok,
            f"{item.batches} live, {item.replay_batches} replayed (replay {item.replay}), "
            f"highest seq {item.highest_seq}, stamped {sorted(item.stamped_ranks)}",
        )
    if len(result.traffic) != len(publishers):
        report.add(
            "events",
            False,
            f"listened to {len(result.traffic)} sources, expected {len(publishers)}",
        )
