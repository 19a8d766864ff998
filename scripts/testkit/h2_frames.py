"""Raw HTTP/2 for clients that misbehave on purpose: frames, HPACK literals, and reading what
the server sends back, with no HTTP/2 library in between (one would refuse to send the hostile
input). Used by ``hostile_patterns``.
"""

from __future__ import annotations

import socket
import struct
import time

from sglang_sidecar_overlay.tools.probe.wire import GET_SERVER_INFO_PATH as GET_SERVER_INFO

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

FRAME_DATA, FRAME_HEADERS, FRAME_RST_STREAM, FRAME_SETTINGS = 0x0, 0x1, 0x3, 0x4
FRAME_PING, FRAME_GOAWAY, FRAME_CONTINUATION = 0x6, 0x7, 0x9
FLAG_END_STREAM, FLAG_END_HEADERS = 0x1, 0x4
FRAME_NAMES = {
    0x0: "DATA",
    0x1: "HEADERS",
    0x3: "RST_STREAM",
    0x4: "SETTINGS",
    0x6: "PING",
    0x7: "GOAWAY",
    0x8: "WINDOW_UPDATE",
}


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out, value = bytearray([first | limit]), value - limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def hpack_literal(name: str, value: str | bytes) -> bytes:
    """A literal header field without indexing, no Huffman coding (RFC 7541 §6.2.2)."""
    raw = value.encode() if isinstance(value, str) else value
    return b"\x00" + _hpack_int(len(name), 7) + name.encode() + _hpack_int(len(raw), 7) + raw


def grpc_request_headers(address: str, extra: bytes = b"") -> bytes:
    return (
        hpack_literal(":method", "POST")
        + hpack_literal(":scheme", "http")
        + hpack_literal(":path", GET_SERVER_INFO)
        + hpack_literal(":authority", address)
        + hpack_literal("content-type", "application/grpc")
        + hpack_literal("te", "trailers")
        + extra
    )


def h2_connect(address: str, timeout: float = 10.0) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.sendall(PREFACE + frame(FRAME_SETTINGS, 0, 0))
    return sock


def read_frames(sock: socket.socket, deadline: float, max_frames: int = 10_000) -> list[str]:
    """Frames the server sends until it closes or the deadline passes, as names
    (``RST_STREAM(code)``, ``GOAWAY(code)``); ``closed`` last if it closed."""
    seen: list[str] = []
    buf = b""
    while len(seen) < max_frames:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return seen
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return seen
        except OSError:
            chunk = b""
        if not chunk:
            return [*seen, "closed"]
        buf += chunk
        while len(buf) >= 9:
            length = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + length:
                break
            kind, payload = buf[3], buf[9 : 9 + length]
            buf = buf[9 + length :]
            name = FRAME_NAMES.get(kind, f"0x{kind:x}")
            if kind == FRAME_RST_STREAM:
                name += f"({int.from_bytes(payload[:4], 'big')})"
            elif kind == FRAME_GOAWAY:
                name += f"({int.from_bytes(payload[4:8], 'big')})"
            seen.append(name)
    return seen


def summarize(frames: list[str]) -> str:
    """The frames that tell what the server decided, in order, without repeats."""
    out: list[str] = []
    for name in frames:
        if name.startswith(("SETTINGS", "WINDOW_UPDATE", "PING")):
            continue
        if not out or out[-1] != name:
            out.append(name)
    return ", ".join(out) or "no reply"


def wait_closed(sock: socket.socket, deadline: float) -> bool:
    """Reads and discards until the server closes (True) or the deadline passes (False)."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        sock.settimeout(remaining)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True


def reset_close(sock: socket.socket) -> None:
    """Closes with a TCP RST instead of a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def summarize_raw(data: bytes) -> str:
    if len(data) >= 9 and data[3] in FRAME_NAMES:
        return "HTTP/2 " + FRAME_NAMES[data[3]]
    return repr(data[:16])
