"""Program run in an SGLang environment: one launch of row 8, a leader node with SGLang's real
schedulers on the CPU test platform, with this plugin allowed or not, under a fixed workload.

    python -m bench.serving_launch --side overlay|stock [--requests 64]

run by ``bench.serving`` with the package copy, ``scripts/`` and ``test-registered/``
importable (``dev_paths.child_environ``).

The node is ``test-registered``'s harness: ``overlay_harness.group`` builds its arguments (the
tiny config-only model, the CPU platform, one node, a ZMQ KV-event publisher bound on a free
port and read on loopback; ``--grpc-port`` on both sides, as users launch) and
``overlay_harness.nodes.Node`` runs it as ``python -m overlay_harness.node_process leader ...``,
in a session of its own, and stops it: stdin closed (SGLang's SIGTERM drain), then its whole
session killed. A SIGTERM to this program stops the node the same way; if this program dies
outright, the node sees its stdin close and stops itself.

Both sides set ``SGLANG_PLATFORM`` to the CPU platform, which SGLang resolves by that name
without reading ``SGLANG_PLUGINS``; the allow-list differs only in naming this plugin
(``sidecar_overlay``) or no installed plugin (``none``).

Measured: the launch (process start to the node's ready event: SGLang's ``launch_callback``,
after its warm-up request; and the CPU time the node's processes used to get there), a
closed-loop workload of streamed ``POST /generate`` requests (throughput, latency, time to
first token, the node's CPU time per request), the delay from each request's first streamed
token to the arrival of the KV-event batch holding its prompt's first page (a SUB socket on
the endpoint the overlay advertises in GetServerInfo's ``kv_event_sources``; on the stock side
the launch's own), and the resident memory of the engine process and its schedulers once the
workload has run. Prints one JSON line: the figures, or ``{"error": ...}`` (details on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import os
import queue
import random
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import zmq
from overlay_harness.group import KV_TOPIC, LOOPBACK, PAGE_SIZE, EngineGroup
from overlay_harness.kv_events import FIRST_TOKEN, VOCAB
from overlay_harness.nodes import Node
from sglang_sidecar_overlay.contract.events import BlockStored, EventBatch
from sglang_sidecar_overlay.entry_point import PLUGIN_NAME, SGLANG_PLUGINS_ENV
from sglang_sidecar_overlay.sidecar import proctree

# What the node's SGLANG_PLUGINS is on each side: this plugin, or no installed plugin.
ALLOW_LISTS = {"overlay": PLUGIN_NAME, "stock": "none"}
# SGLang, the overlay and Dynamo read switches from the environment a node inherits; as in
# test-registered's conftest, only the scripts' own SGLANG_OVERLAY_* settings are kept.
INHERITED_PREFIXES = ("SGLANG_", "DYN_")
KEPT_PREFIX = "SGLANG_OVERLAY_"
# Deadlines: a launch imports SGLang in several processes on a shared 2-core machine.
READY_DEADLINE = 300.0
REQUEST_DEADLINE = 120.0
SUBSCRIBE_DEADLINE = 60.0
EVENTS_DEADLINE = 30.0
# /proc comm of SGLang's scheduler processes ("sglang::scheduler...", cut to 15 bytes).
SCHEDULER_COMM = b"sglang::schedul"


@dataclasses.dataclass(frozen=True)
class Workload:
    requests: int
    input_tokens: int
    output_tokens: int
    concurrency: int


@dataclasses.dataclass
class RequestTimes:
    """One streamed request, on the monotonic clock the KV-event arrivals use."""

    prompt: list[int]
    sent: float = 0.0
    first: float = 0.0
    done: float = 0.0


def scrub_environ() -> None:
    for name in list(os.environ):
        if name.startswith(INHERITED_PREFIXES) and not name.startswith(KEPT_PREFIX):
            del os.environ[name]


def prompt(name: str, length: int) -> list[int]:
    """The prompt called ``name``: random tokens, so its first page names its request."""
    rng = random.Random(name)
    return [rng.randrange(FIRST_TOKEN, VOCAB) for _ in range(length)]


# --- the node ----------------------------------------------------------------------------------


@contextlib.contextmanager
def running_node(side: str, log_dir: Path) -> Iterator[tuple[Node, CpuMark]]:
    """The side's leader, started and ready, with the mark taken as its process started;
    always stopped."""
    group = EngineGroup(1, [])
    # The node inherits this program's path (the package copy, the harness) with its
    # environment (``overlay_harness.inside.harness_environ``).
    env = {SGLANG_PLUGINS_ENV: ALLOW_LISTS[side]}
    # The same launch on both sides, native gRPC included: only the allow-list differs.
    launch = group.launch(0, grpc=True, env=env)
    started = cpu_mark(None)
    node = Node(launch, log_dir, f"{side}-leader")
    try:
        node.expect_ready(READY_DEADLINE)
        yield node, started
    finally:
        node.stop()


def kv_source(node: Node, side: str) -> tuple[str, str, str]:
    """(endpoint, topic, where it came from) of the node's KV-event publisher."""
    if side == "stock":
        return f"tcp://{LOOPBACK}:{node.launch.group.kv_base}", KV_TOPIC, "launch"
    info = node.server_info()
    if "kv_event_rank_space" not in info:
        raise RuntimeError("GetServerInfo has no kv_event_rank_space: the overlay is not loaded")
    sources = info["kv_event_sources"]
    if len(sources) != 1:
        raise RuntimeError(f"GetServerInfo advertises {len(sources)} KV sources, not 1")
    (source,) = sources
    return source["endpoint"], source["topic"], "GetServerInfo"


def resident_kib(engine_pid: int) -> dict[str, int]:
    """VmRSS of the engine process and of its scheduler processes (summed)."""
    schedulers = []
    for pid, _start in proctree.descendants(engine_pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_bytes().startswith(SCHEDULER_COMM):
                schedulers.append(pid)
    if not schedulers:
        raise RuntimeError("no scheduler process under the engine process")
    return {"engine": _vm_rss(engine_pid), "schedulers": sum(map(_vm_rss, schedulers))}


def cpu_seconds(engine_pid: int) -> float:
    """User + system CPU time of the engine process and every live process under it."""
    ticks = 0
    for pid in [engine_pid, *(pid for pid, _start in proctree.descendants(engine_pid))]:
        stat = proctree.read_stat(pid)
        if stat is not None:
            ticks += stat.utime + stat.stime
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class CpuMark:
    """CPU seconds used so far: by the whole machine, by the node, by this program."""

    at: float
    machine: float
    node: float
    own: float


def cpu_mark(engine_pid: int | None) -> CpuMark:
    return CpuMark(
        time.monotonic(),
        machine_busy_seconds(),
        cpu_seconds(engine_pid) if engine_pid is not None else 0.0,
        time.process_time(),
    )


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy since boot (``/proc/stat``)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def foreign_cores(start: CpuMark, end: CpuMark) -> float:
    """Cores that processes other than the node and this program kept busy on average
    between two marks: the other load of a shared machine, which the figures cannot see."""
    other = (end.machine - start.machine) - (end.node - start.node) - (end.own - start.own)
    return max(0.0, other) / (end.at - start.at)


def _vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --- KV events ---------------------------------------------------------------------------------


class Subscriber:
    """A SUB socket on a publisher, recording each batch's payload and arrival time."""

    def __init__(self, endpoint: str, topic: str):
        self._context = zmq.Context()
        self._sock = self._context.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sock.connect(endpoint)
        self.arrivals: list[tuple[float, bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, name="kv-sub", daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            if self._sock.poll(timeout=50):
                frames = self._sock.recv_multipart()
                # Stamped before anything else, so decoding is not part of the delay.
                self.arrivals.append((time.monotonic(), frames[-1]))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sock.close()
        self._context.term()


def stored_pages(payload: bytes) -> Iterator[tuple[int, ...]]:
    """The token ids of every page a batch stores (``contract.events``: the batch with its
    events undecoded, which every release's shape fits)."""
    for event in msgspec.msgpack.decode(payload, type=EventBatch).events:
        if isinstance(event, dict):  # 0.5.21+: a map tagged by its "type"
            if event.get("type") != "BlockStored":
                continue
            tokens, size = event["token_ids"], event["block_size"]
        elif isinstance(event, list) and event and event[0] == "BlockStored":  # an array
            stored = msgspec.convert(event, BlockStored)
            tokens, size = stored.token_ids, stored.block_size
        else:
            continue
        for start in range(0, len(tokens), size):
            yield tuple(tokens[start : start + size])


def first_page_arrivals(arrivals: list[tuple[float, bytes]]) -> dict[tuple[int, ...], float]:
    """When each stored page first arrived, by its token ids."""
    seen: dict[tuple[int, ...], float] = {}
    for arrived, payload in arrivals:
        for page in stored_pages(payload):
            seen.setdefault(page, arrived)
    return seen


def prime(node: Node, subscriber: Subscriber, workload: Workload) -> None:
    """Requests outside the workload until the subscriber receives a batch: a SUB socket
    joins asynchronously, and this warms the HTTP path of both sides alike."""
    deadline = time.monotonic() + SUBSCRIBE_DEADLINE
    index = 0
    while not subscriber.arrivals:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no KV-event batch within {SUBSCRIBE_DEADLINE:.0f} s")
        conn = http.client.HTTPConnection(node.address, node.http_port, timeout=REQUEST_DEADLINE)
        try:
            stream_one(conn, RequestTimes(prompt(f"prime-{index}", workload.input_tokens)), 1)
        finally:
            conn.close()
        index += 1
        _wait(lambda: subscriber.arrivals, 2.0)


def _wait(predicate: Callable[[], object], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --- the workload ------------------------------------------------------------------------------


def stream_one(conn: http.client.HTTPConnection, times: RequestTimes, output_tokens: int) -> None:
    """One streamed ``POST /generate`` (token ids in, greedy, EOS ignored); fills ``times``."""
    body = json.dumps(
        {
            "input_ids": times.prompt,
            "sampling_params": {"max_new_tokens": output_tokens, "temperature": 0.0,
                                "ignore_eos": True},
            "stream": True,
        }
    )  # fmt: skip
    times.sent = time.monotonic()
    conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
    reply = conn.getresponse()
    if reply.status != 200:
        raise RuntimeError(f"/generate: {reply.status} {reply.read()[:500]!r}")
    last: dict[str, Any] = {}
    for line in iter(reply.readline, b""):
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        if not times.first:
            times.first = time.monotonic()
        last = json.loads(line[len(b"data: ") :])
    times.done = time.monotonic()
    if "error" in last:
        raise RuntimeError(f"/generate: {last['error']}")
    got = last.get("meta_info", {}).get("completion_tokens")
    if got != output_tokens:
        raise RuntimeError(f"/generate returned {got} tokens, not {output_tokens}")


def run_workload(node: Node, workload: Workload) -> tuple[list[RequestTimes], float]:
    """Every request, ``concurrency`` at a time (closed loop: each worker sends its next one
    when its last one ends); the requests and the seconds they took together."""
    requests = [
        RequestTimes(prompt(f"request-{i}", workload.input_tokens))
        for i in range(workload.requests)
    ]
    todo: queue.Queue[RequestTimes] = queue.Queue()
    for times in requests:
        todo.put(times)
    failures: list[BaseException] = []

    def worker() -> None:
        conn = http.client.HTTPConnection(node.address, node.http_port, timeout=REQUEST_DEADLINE)
        try:
            while not failures:
                try:
                    times = todo.get_nowait()
                except queue.Empty:
                    return
                stream_one(conn, times, workload.output_tokens)
        except BaseException as exc:
            failures.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(workload.concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    if failures:
        raise failures[0]
    return requests, elapsed


def kv_delays(requests: list[RequestTimes], subscriber: Subscriber) -> list[float]:
    """Per request, seconds from its first streamed token to the arrival of the batch holding
    its first page; waits (up to a deadline) until every request's has arrived."""
    keys = [tuple(times.prompt[:PAGE_SIZE]) for times in requests]

    deadline = time.monotonic() + EVENTS_DEADLINE
    while True:
        seen = first_page_arrivals(list(subscriber.arrivals))
        missing = sum(key not in seen for key in keys)
        if not missing:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"no stored-block event for {missing} of {len(keys)} requests")
        time.sleep(0.2)
    return [seen[key] - times.first for key, times in zip(keys, requests, strict=True)]


# --- one launch --------------------------------------------------------------------------------


def measure(side: str, workload: Workload, log_dir: Path) -> dict[str, Any]:
    with running_node(side, log_dir) as (node, started):
        ready = cpu_mark(node.proc.pid)
        endpoint, topic, endpoint_from = kv_source(node, side)
        subscriber = Subscriber(endpoint, topic)
        try:
            prime(node, subscriber, workload)
            before = cpu_mark(node.proc.pid)
            requests, elapsed = run_workload(node, workload)
            after = cpu_mark(node.proc.pid)
            delays = kv_delays(requests, subscriber)
        finally:
            subscriber.close()
        rss = resident_kib(node.proc.pid)
    return {
        "side": side,
        "launch": ready.at - started.at,
        "launch_cpu": ready.node,
        "rps": len(requests) / elapsed,
        "cpu_per_request": (after.node - before.node) / len(requests),
        "latency": [times.done - times.sent for times in requests],
        "ttft": [times.first - times.sent for times in requests],
        "kv_delay": delays,
        "rss_kib": rss,
        "kv_endpoint_from": endpoint_from,
        "foreign_cores": {"launch": foreign_cores(started, ready),
                          "workload": foreign_cores(before, after)},
    }  # fmt: skip


def _stop_on_sigterm() -> None:
    """A SIGTERM unwinds like an exception, so the node is stopped on the way out; only the
    first, so a second one cannot cut that stop short. Ctrl-C is the parent's to handle: it
    sends the SIGTERM."""

    def handler(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--side", choices=sorted(ALLOW_LISTS), required=True)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    _stop_on_sigterm()
    scrub_environ()
    workload = Workload(args.requests, args.input_tokens, args.output_tokens, args.concurrency)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-serving-") as log_dir:
            result = measure(args.side, workload, Path(log_dir))
    except Exception as exc:
        traceback.print_exc()
        first_line = (str(exc).splitlines() or [""])[0]
        print(json.dumps({"error": f"{type(exc).__name__}: {first_line}"}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
