"""A ``--sidecar`` provider that does what a KV-aware router's sidecar does first.

``main(argv)``: read the node's endpoint from ``SGLANG_GRPC_ENDPOINT``, fetch the node's
``GetServerInfo`` (recording whether the very first attempt already succeeded), subscribe to
every advertised ``kv_event_sources`` entry and wait for one event batch per source. Progress
goes to the JSON-lines file named by ``--report``, one object per step, flushed at once, so
a test can follow it while the provider runs. Then it stays up until SIGTERM, which it
records before exiting 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

import grpc
import zmq
from sglang_sidecar_overlay.tools.probe import wire as _grpc_wire

ENDPOINT_ENV = "SGLANG_GRPC_ENDPOINT"


class Report:
    def __init__(self, path: str) -> None:
        self._handle = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self._lock = threading.Lock()

    def write(self, step: str, **fields: object) -> None:
        with self._lock:
            record = {"step": step, "pid": os.getpid(), "time": time.time(), **fields}
            self._handle.write(json.dumps(record) + "\n")
            self._handle.flush()
            os.fsync(self._handle.fileno())


def _target(endpoint: str) -> str:
    return endpoint.split("://", 1)[1] if "://" in endpoint else endpoint


def fetch_server_info(endpoint: str, report: Report, deadline: float) -> dict:
    attempts = 0
    with grpc.insecure_channel(_target(endpoint)) as channel:
        call = channel.unary_unary(
            _grpc_wire.GET_SERVER_INFO_PATH,
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        while True:
            attempts += 1
            try:
                reply = call(_grpc_wire.encode_get_server_info_request(), timeout=10.0)
            except grpc.RpcError as exc:
                if time.monotonic() > deadline:
                    raise
                report.write("info_retry", attempt=attempts, error=str(exc.code()))
                time.sleep(0.2)
                continue
            info = json.loads(_grpc_wire.decode_get_server_info_response(reply))
            report.write(
                "server_info",
                attempts=attempts,
                node_rank=info.get("node_rank"),
                sources=info.get("kv_event_sources"),
            )
            return info


def receive_events(sources: list[dict], report: Report, deadline: float) -> None:
    context = zmq.Context.instance()
    sockets = []
    poller = zmq.Poller()
    for source in sources:
        sock = context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt_string(zmq.SUBSCRIBE, source.get("topic", ""))
        sock.connect(source["endpoint"])
        sockets.append((sock, source))
        poller.register(sock, zmq.POLLIN)
    report.write("subscribed", endpoints=[s["endpoint"] for s in sources])
    waiting = {id(sock) for sock, _ in sockets}
    while waiting and time.monotonic() < deadline:
        for sock, source in sockets:
            if id(sock) in waiting and dict(poller.poll(100)).get(sock):
                frames = sock.recv_multipart()
                waiting.discard(id(sock))
                report.write(
                    "event",
                    dp_rank=source["dp_rank"],
                    endpoint=source["endpoint"],
                    frames=len(frames),
                    topic=frames[0].decode("utf-8", "replace"),
                )
    if waiting:
        report.write("no_event", missing=len(waiting))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kv_probe")
    parser.add_argument("--report", required=True)
    parser.add_argument("--deadline", type=float, default=120.0)
    args = parser.parse_args(argv)
    report = Report(args.report)
    stop = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        report.write("sigterm")
        stop.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    endpoint = os.environ.get(ENDPOINT_ENV, "")
    report.write("started", endpoint=endpoint, argv=list(argv or []))
    deadline = time.monotonic() + args.deadline
    info = fetch_server_info(endpoint, report, deadline)
    receive_events(info.get("kv_event_sources") or [], report, deadline)
    report.write("idle")
    stop.wait()
    report.write("exiting")
    sys.exit(0)
