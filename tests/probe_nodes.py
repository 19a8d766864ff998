"""Probe targets for the probe and CLI tests: grpcio nodes serving a given reply, stand-in
publishers feeding events, a node's good server info, and the CLI run as a subprocess."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import sglang_sidecar_overlay
import zmq
from dev_paths import child_environ
from sglang_sidecar_overlay.contract.server_info import LEGACY_DP_SIZE_ENV
from sglang_sidecar_overlay.tools import probe
from sglang_sidecar_overlay.tools.probe import wire
from sglang_sidecar_overlay.tools.selftest import StandInPublisher, node_snapshot
from testkit.wire_server import (
    decode_get_server_info_request,
    decode_health_check_request,
    encode_get_server_info_response,
    encode_health_check_response,
)

# The CLI subprocess imports the same package as the test process.
PACKAGE_PARENT = Path(sglang_sidecar_overlay.__file__).resolve().parent.parent


@contextlib.contextmanager
def grpc_node(
    info_text: str | None = None,
    *,
    health: int | None = None,
    sglang: bool = True,
    hang: bool = False,
    host: str = "127.0.0.1",
) -> Iterator[str]:
    """A small grpcio server standing in for a node; yields its HOST:PORT.

    ``sglang=False`` serves an unrelated service only (GetServerInfo is UNIMPLEMENTED);
    ``hang=True`` never answers GetServerInfo until the server is stopped.
    """
    release = threading.Event()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))

    def get_server_info(_request: object, _context: object) -> str:
        if hang:
            release.wait(60)
        return info_text or ""

    def health_check(_service: str, _context: object) -> int:
        return health or 0

    def ping(request: bytes, _context: object) -> bytes:
        return request

    if sglang:
        handler = grpc.unary_unary_rpc_method_handler(
            get_server_info,
            request_deserializer=decode_get_server_info_request,
            response_serializer=encode_get_server_info_response,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(wire.SGLANG_SERVICE, {"GetServerInfo": handler}),)
        )
    else:
        handler = grpc.unary_unary_rpc_method_handler(ping)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("example.v1.Echo", {"Ping": handler}),)
        )
    if health is not None:
        handler = grpc.unary_unary_rpc_method_handler(
            health_check,
            request_deserializer=decode_health_check_request,
            response_serializer=encode_health_check_response,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(wire.HEALTH_SERVICE, {"Check": handler}),)
        )
    bind = f"[{host}]:0" if ":" in host else f"{host}:0"
    port = server.add_insecure_port(bind)
    server.start()
    try:
        yield probe.grpc_target(host, port)
    finally:
        release.set()
        server.stop(grace=None).wait(10)


@contextlib.contextmanager
def stand_in_publishers(*ranks: int) -> Iterator[list[StandInPublisher]]:
    """One real publisher per rank, bound on wildcard TCP with replay routers; all closed at
    the end."""
    context = zmq.Context()
    with contextlib.ExitStack() as stack:
        stack.callback(context.term)
        publishers = []
        for rank in ranks:
            publisher = StandInPublisher(context, rank)
            stack.callback(publisher.close)
            publishers.append(publisher)
        yield publishers


@contextlib.contextmanager
def live_publishers(stamp_rank: int | None = None) -> Iterator[list[StandInPublisher]]:
    """Two real publishers (ranks 2 and 3) bound on wildcard TCP with replay routers."""
    context = zmq.Context()
    publishers: list[StandInPublisher] = []
    try:
        publishers.append(StandInPublisher(context, 2))
        publishers.append(StandInPublisher(context, 3, stamp_rank=stamp_rank))
        yield publishers
    finally:
        for pub in publishers:
            pub.close()
        context.term()


@contextlib.contextmanager
def feeding(publishers: list[StandInPublisher], interval: float = 0.05) -> Iterator[None]:
    """Publish one batch per rank every ``interval`` while the block runs."""
    stop = threading.Event()

    def feed() -> None:
        block = 0
        while not stop.wait(interval):
            for pub in publishers:
                pub.publish([block])
            block += 1

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def publish_history(publishers: list[StandInPublisher], blocks: list[int]) -> None:
    """Publish one batch per block on every rank and wait until each publisher has buffered them.

    ``publish`` only queues; a replay request served before the queue drains would see less.
    """
    for pub in publishers:
        for block in blocks:
            pub.publish([block])
    deadline = time.monotonic() + 10
    while any(pub.published < len(blocks) for pub in publishers):
        assert time.monotonic() < deadline, "publishers did not buffer their history in time"
        time.sleep(0.01)


def good_info(publishers: list[StandInPublisher]) -> dict:
    """A contract-clean follower snapshot for the publishers (legacy dp_size on: no warning)."""
    return node_snapshot(publishers, legacy_dp_size=True)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, read, released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def errors_of(findings: list[probe.Finding]) -> dict[str, str]:
    return {f.field or f.check: f.message for f in findings if f.level == probe.ERROR}


def warnings_of(findings: list[probe.Finding]) -> dict[str, str]:
    return {f.field or f.check: f.message for f in findings if f.level == probe.WARNING}


CLI = [sys.executable, "-m", "sglang_sidecar_overlay"]


def cli_environ(extra_path: tuple[Path, ...] = (), env: dict | None = None) -> dict[str, str]:
    """The CLI's environment: this package importable, no switch from the caller's shell."""
    environ = child_environ(*extra_path, PACKAGE_PARENT, inherit=False)
    for name in ("SGLANG_PLUGINS", LEGACY_DP_SIZE_ENV):
        environ.pop(name, None)
    environ["PYTHONIOENCODING"] = "utf-8"
    environ.update(env or {})
    return environ


def run_cli(
    *args: str, extra_path: tuple[Path, ...] = (), env: dict | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_environ(extra_path, env),
        check=False,
    )
