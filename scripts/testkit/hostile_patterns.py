"""Hostile clients of a metadata server, and how to watch the server while they run.

Shared by ``tests/native/test_hostile_input.py`` (this project's server, assertions on
behaviour) and ``scripts/hostile.py`` (this project's and upstream SGLang's, side by side, into
``docs/hostile-input.md``). Every pattern talks to a real server over loopback with real
sockets, and every loop in it is bounded in count and in time.

The server runs in its own process (the benchmark's ``bench.servers.server_process``) so its
resident memory can be read from ``/proc`` while the patterns run in this one.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import socket
import statistics
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# The server under test, in its own process, is the benchmark's (``python -m bench.serve``).
from bench.servers import (
    ServerProcess,
    build_client,
    encoded_response,
    server_process,
    snapshot,
)
from sglang_sidecar_overlay.tools.probe.wire import GET_SERVER_INFO_PATH as GET_SERVER_INFO
from sglang_sidecar_overlay.tools.probe.wire import encode_varint as _varint

from testkit.h2_frames import (
    FLAG_END_HEADERS,
    FLAG_END_STREAM,
    FRAME_CONTINUATION,
    FRAME_DATA,
    FRAME_HEADERS,
    FRAME_RST_STREAM,
    FRAME_SETTINGS,
    PREFACE,
    frame,
    grpc_request_headers,
    h2_connect,
    hpack_literal,
    read_frames,
    reset_close,
    summarize,
    summarize_raw,
    wait_closed,
)

__all__ = ["ServerProcess", "server_process", "snapshot"]

MIB = 1024 * 1024

# --- a well-behaved client -----------------------------------------------------------------


def grpc_call(address: str, timeout: float = 10.0) -> bytes:
    """One GetServerInfo on a fresh grpcio channel; returns the raw response message."""
    import grpc

    with grpc.insecure_channel(
        address, options=[("grpc.max_receive_message_length", -1)]
    ) as channel:
        return channel.unary_unary(GET_SERVER_INFO)(b"", timeout=timeout)


@dataclass
class LegitClient:
    """Calls GetServerInfo back to back on one established channel while a pattern runs.

    At most ``max_calls`` calls, each with a deadline, so the loop ends whatever the server does.
    """

    address: str
    max_calls: int = 100_000
    call_timeout: float = 10.0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import grpc

        with grpc.insecure_channel(
            self.address, options=[("grpc.max_receive_message_length", -1)]
        ) as channel:
            call = channel.unary_unary(GET_SERVER_INFO)
            call(b"", timeout=self.call_timeout, wait_for_ready=True)  # connected before
            self._connected.set()
            for _ in range(self.max_calls):
                if self._stop.is_set():
                    return
                started = time.monotonic()
                try:
                    call(b"", timeout=self.call_timeout)
                    self.latencies.append(time.monotonic() - started)
                except grpc.RpcError as err:
                    self.errors.append(f"{err.code().name}: {err.details()}")
                # Paced, not flooding: a client that polls server info now and then.
                self._stop.wait(0.01)

    def __enter__(self) -> LegitClient:
        self._connected = threading.Event()
        self._thread.start()
        if not self._connected.wait(30):
            raise RuntimeError(f"legitimate client could not reach {self.address}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.call_timeout + 5)

    def wait_calls(self, count: int, timeout: float) -> None:
        """Returns once ``count`` calls finished (answered or failed) or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        while len(self.latencies) + len(self.errors) < count and time.monotonic() < deadline:
            if not self._thread.is_alive():
                return
            time.sleep(0.01)

    def p99_ms(self) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000


# --- the patterns ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What the server did to the hostile client, in words, plus figures for assertions."""

    status: str
    figures: dict[str, Any] = field(default_factory=dict)


def garbage(address: str) -> Outcome:
    """64 KiB of random bytes on a fresh connection."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(os.urandom(64 * 1024))
        closed = wait_closed(sock, time.monotonic() + 15)
    return Outcome("closed" if closed else "open after 15 s", {"closed": closed})


def http1(address: str) -> Outcome:
    """An HTTP/1.1 request for the gRPC path."""
    host, port = address.rsplit(":", 1)
    request = f"POST {GET_SERVER_INFO} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request.encode())
        reply, deadline = b"", time.monotonic() + 15
        closed = False
        while time.monotonic() < deadline and len(reply) < 4096:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                closed = True
                break
            reply += chunk
    first = reply.split(b"\r\n", 1)[0].decode(errors="replace")
    if first.startswith("HTTP/"):
        status = f"replied {first!r}"
    elif reply:
        status = f"sent {len(reply)} bytes ({summarize_raw(reply)})"
    else:
        status = "closed, no reply" if closed else "open after 15 s, no reply"
    return Outcome(status + (", closed" if closed and reply else ""), {"closed": closed})


def preface_then_garbage(address: str) -> Outcome:
    """A valid HTTP/2 preface, then 64 KiB that are not frames."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(PREFACE + b"\xff" * (64 * 1024))
        frames = read_frames(sock, time.monotonic() + 15)
    return Outcome(summarize(frames), {"closed": "closed" in frames})


def oversized_headers(address: str, total: int = MIB) -> Outcome:
    """One request whose header block is ``total`` bytes, in 16 KiB HEADERS/CONTINUATIONs."""
    block = grpc_request_headers(address) + b"".join(
        hpack_literal(f"x-pad-{i}", "p" * 4000) for i in range(total // 4000)
    )
    chunks = [block[i : i + 16_000] for i in range(0, len(block), 16_000)]
    with h2_connect(address) as sock:
        try:
            for i, chunk in enumerate(chunks):
                kind = FRAME_HEADERS if i == 0 else FRAME_CONTINUATION
                flags = FLAG_END_HEADERS if i == len(chunks) - 1 else 0
                if i == 0:
                    flags |= FLAG_END_STREAM
                sock.sendall(frame(kind, flags, 1, chunk))
        except OSError:
            pass
        frames = read_frames(sock, time.monotonic() + 15)
    # DATA would be the snapshot: the request went through.
    return Outcome(summarize(frames), {"answered": "DATA" in frames})


def huge_body(address: str, total: int = 2048 * MIB, message: int = MIB) -> Outcome:
    """A GetServerInfo call whose request streams ``total`` bytes in well-formed
    ``message``-byte messages, produced lazily by the client."""
    import grpc

    produced = 0
    # A well-formed GetServerInfoRequest: one unknown length-delimited field (number 15)
    # filling the message, so a server that parses what it reads finds nothing wrong.
    payload = message - 1 - len(_varint(message))
    payload -= len(_varint(payload)) - len(_varint(message))
    chunk = bytes([15 << 3 | 2]) + _varint(payload) + b"\x00" * payload

    def body() -> Iterator[bytes]:
        nonlocal produced
        for _ in range(total // message):
            produced += 1
            yield chunk

    started = time.monotonic()
    with grpc.insecure_channel(
        address,
        options=[
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1),
        ],
    ) as channel:
        try:
            channel.stream_unary(GET_SERVER_INFO)(body(), timeout=300)
            status = "answered (OK)"
            code = "OK"
        except grpc.RpcError as err:
            code = err.code().name
            status = code
    sent = produced * message
    figures = {"code": code, "sent_bytes": sent, "seconds": time.monotonic() - started}
    return Outcome(f"{status} after {sent / MIB:,.0f} MiB sent", figures)


def connection_flood(address: str, count: int = 10_000, hold: float = 3.0) -> Outcome:
    """``count`` connections at once, each sending the preface and SETTINGS and then nothing;
    held ``hold`` seconds, then closed. Reports how many the server had closed by then."""
    host, port = address.rsplit(":", 1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = count + 1024
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise RuntimeError(f"RLIMIT_NOFILE hard limit {hard} is below the {needed} needed")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    socks: list[socket.socket] = []
    try:
        selector = selectors.DefaultSelector()
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex((host, int(port)))
            socks.append(sock)
            selector.register(sock, selectors.EVENT_WRITE)
        # Send the greeting as each connect completes; bounded by a deadline.
        pending, deadline = len(socks), time.monotonic() + 30
        failed = 0
        while pending and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.5):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                selector.unregister(sock)
                pending -= 1
                try:
                    sock.send(PREFACE + frame(FRAME_SETTINGS, 0, 0))
                except OSError:
                    failed += 1
        selector.close()
        time.sleep(hold)  # the pattern is "held open for a while"; nothing is awaited here
        open_count = sum(1 for sock in socks if _still_open(sock))
    finally:
        for sock in socks:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    figures = {"held_open": open_count, "never_connected": pending, "failed": failed}
    return Outcome(f"{open_count:,} of {count:,} held open after {hold:.0f} s", figures)


def _still_open(sock: socket.socket) -> bool:
    """Drains what the server sent; False if it closed or reset the connection."""
    try:
        while True:
            data = sock.recv(65536, socket.MSG_DONTWAIT)
            if not data:
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def slowloris(address: str, max_seconds: float = 20.0) -> Outcome:
    """The HTTP/2 preface one byte a second, for at most ``max_seconds``."""
    host, port = address.rsplit(":", 1)
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for byte in PREFACE:
            if time.monotonic() - started >= max_seconds:
                break
            try:
                sock.send(bytes([byte]))
            except OSError:
                break
            if wait_closed(sock, time.monotonic() + 1.0):
                elapsed = time.monotonic() - started
                return Outcome(f"dropped after {elapsed:.0f} s", {"dropped_after": elapsed})
    return Outcome(f"still open after {max_seconds:.0f} s", {"dropped_after": None})


def resets(address: str, streams: int = 2000, sockets: int = 200) -> Outcome:
    """Calls reset in the middle: ``streams`` requests each cancelled (RST_STREAM) right after
    its HEADERS on one connection (rapid reset), then ``sockets`` connections closed with a
    TCP RST halfway through a request."""
    headers = grpc_request_headers(address)
    with h2_connect(address) as sock:
        try:
            burst = b"".join(
                frame(FRAME_HEADERS, FLAG_END_HEADERS, 2 * i + 1, headers)
                + frame(FRAME_RST_STREAM, 0, 2 * i + 1, struct.pack(">I", 8))  # CANCEL
                for i in range(streams)
            )
            sock.sendall(burst)
        except OSError:
            pass
        frames = read_frames(sock, time.monotonic() + 3)
    for _ in range(sockets):
        with contextlib.suppress(OSError):
            half = h2_connect(address)
            half.sendall(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, headers) + b"\x00\x00")
            reset_close(half)
    rapid = summarize(frames)
    return Outcome(f"rapid reset: {rapid}; mid-call TCP RST x{sockets}: served on", {})


REFLECTION_INFO = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"


def _count_refused_streams(socks: list[socket.socket], expected: int, deadline: float) -> int:
    """Reads every connection until ``expected`` streams were refused at once (a response that
    is only trailers: a first HEADERS frame with END_STREAM) or the deadline passes; returns
    how many were. Reading grants the server no flow-control window: only WINDOW_UPDATE does."""
    selector = selectors.DefaultSelector()
    buffers: dict[socket.socket, bytes] = {}
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        buffers[sock] = b""
    answered: set[tuple[int, int]] = set()
    refused = 0
    try:
        while refused < expected and (remaining := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(timeout=remaining):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    selector.unregister(sock)
                    continue
                buf = buffers[sock] + chunk
                while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                    length, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
                    stream = struct.unpack(">I", buf[5:9])[0] & 0x7FFFFFFF
                    if kind == FRAME_HEADERS and (sock.fileno(), stream) not in answered:
                        answered.add((sock.fileno(), stream))
                        refused += bool(flags & FLAG_END_STREAM)
                    buf = buf[9 + length :]
                buffers[sock] = buf
    finally:
        selector.close()
    return refused


def reflection_streams(
    address: str, connections: int = 50, streams: int = 10, requests: int = 150
) -> Outcome:
    """``connections`` connections, each opening ``streams`` reflection streams that each send
    ``requests`` requests for the largest descriptor served (more requests than a stream may
    carry) and never grant the server window beyond HTTP/2's initial 64 KiB to answer them.
    What is sent stays within the server's windows, so the server is asked to answer, not to
    police flow control. Held until every stream beyond the server's reflection stream cap was
    refused (at most 30 s), then closed."""
    from sglang_sidecar_overlay._native import MAX_REFLECTION_STREAMS

    symbol = b"grpc.reflection.v1.ServerReflection"
    message = bytes([4 << 3 | 2]) + _varint(len(symbol)) + symbol  # file_containing_symbol
    body = (b"\x00" + struct.pack(">I", len(message)) + message) * requests
    if streams * len(body) > 65_535:
        raise ValueError(f"{streams} streams of {len(body)} bytes exceed one connection window")
    headers = grpc_request_headers(address).replace(
        hpack_literal(":path", GET_SERVER_INFO), hpack_literal(":path", REFLECTION_INFO)
    )
    socks: list[socket.socket] = []
    try:
        for _ in range(connections):
            with contextlib.suppress(OSError):
                sock = h2_connect(address)
                socks.append(sock)
                sock.sendall(
                    b"".join(
                        frame(FRAME_HEADERS, FLAG_END_HEADERS, 2 * i + 1, headers)
                        + frame(FRAME_DATA, 0, 2 * i + 1, body)
                        for i in range(streams)
                    )
                )
        opened = len(socks) * streams
        refused = _count_refused_streams(
            socks, opened - MAX_REFLECTION_STREAMS, time.monotonic() + 30
        )
    finally:
        for sock in socks:
            sock.close()
    return Outcome(
        f"{refused} of {opened} streams refused at once, the rest answered until unread",
        {"streams": opened, "refused": refused},
    )


PATTERNS: dict[str, tuple[str, Callable[[str], Outcome]]] = {
    "garbage": ("64 KiB of random bytes", garbage),
    "http1": ("an HTTP/1.1 request", http1),
    "preface-garbage": ("HTTP/2 preface, then 64 KiB of garbage", preface_then_garbage),
    "oversized-headers": ("1 MiB of request headers", oversized_headers),
    "huge-body": ("2 GiB request body, streamed lazily in 1 MiB messages", huge_body),
    "connection-flood": (
        "10,000 concurrent connections (preface + SETTINGS, then idle)",
        connection_flood,
    ),
    "slowloris": ("the preface at one byte a second (at most 20 s)", slowloris),
    "resets": ("2,000 rapid stream resets, 200 TCP resets mid-request", resets),
    "reflection-streams": (
        "50 connections x 10 reflection streams of 150 requests, answers never read",
        reflection_streams,
    ),
}


# --- one pattern, watched ----------------------------------------------------------------------


@dataclass
class Run:
    """A pattern's outcome with the server's memory and a legitimate client's experience."""

    pattern: str
    outcome: Outcome
    idle_kib: int
    peak_kib: int
    after_kib: int
    alive: bool
    legit_calls: int
    legit_errors: list[str]
    legit_p99_ms: float | None

    @property
    def peak_delta_mib(self) -> float:
        return (self.peak_kib - self.idle_kib) / 1024

    @property
    def after_delta_mib(self) -> float:
        return (self.after_kib - self.idle_kib) / 1024


def run_pattern(server: ServerProcess, name: str, min_legit_calls: int = 20, **kwargs: Any) -> Run:
    """Runs one pattern against ``server`` while a legitimate client polls it; the legitimate
    client goes on until it made ``min_legit_calls`` calls (at most 60 s more), so a pattern
    that ends at once still leaves a few answers to judge the server by."""
    _, hostile = PATTERNS[name]
    grpc_call(server.address)  # warm: the first call's allocations are not the pattern's
    idle = server.rss_kib()
    server.reset_peak()
    with LegitClient(server.address) as legit:
        outcome = hostile(server.address, **kwargs)
        legit.wait_calls(min_legit_calls, timeout=60)
    alive = server.alive()
    peak = server.peak_kib() if alive else 0
    after = server.rss_kib() if alive else 0
    return Run(
        name,
        outcome,
        idle,
        peak,
        after,
        alive,
        len(legit.latencies) + len(legit.errors),
        legit.errors,
        legit.p99_ms(),
    )


def soak_figures(samples: list[int]) -> dict[str, float]:
    """Mean RSS of the first and last quarter of the samples, and the growth between them."""
    quarter = max(1, len(samples) // 4)
    first = statistics.mean(samples[:quarter])
    last = statistics.mean(samples[-quarter:])
    return {"first_quarter_kib": first, "last_quarter_kib": last, "growth": last / first - 1}


def soak(server: ServerProcess, json_info: str, clients: int, calls: int) -> dict[str, Any]:
    """``clients`` HTTP/2 connections making ``calls`` GetServerInfo calls each, back to back,
    from ``rust/bench-client``; the server's RSS is sampled every 50 ms meanwhile.

    Returns the load client's report (requests, errors, rps, latency percentiles) with the
    memory figures of :func:`soak_figures` and the sample count added.
    """
    client = build_client()
    grpc_call(server.address)
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05) and server.alive():
            samples.append(server.rss_kib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out = subprocess.run(
            [
                str(client),
                "--target",
                server.address,
                "--concurrency",
                str(clients),
                "--calls",
                str(calls),
                "--expect-bytes",
                str(len(encoded_response(json_info))),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
            check=True,
        )
    finally:
        done.set()
        sampler.join(5)
    report = json.loads(out.stdout)
    report.update(soak_figures(samples) if samples else {})
    report["samples"] = len(samples)
    return report
