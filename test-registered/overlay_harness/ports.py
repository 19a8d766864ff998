"""Free TCP ports for test launches, from this session's share of the range below the
ephemeral ports.

A port picked from the ephemeral range can be taken by any client socket (a gRPC probe, a ZMQ
connect) between the check here and the node's bind; below it, only another explicit bind can.
Sessions run side by side (``scripts/sglang_envs.py test --jobs N``) take disjoint shares, so
two of them never hand out the same port.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
from pathlib import Path

# Set by ``scripts/sglang_envs.py test --jobs N`` for sessions run side by side: "<index>/<count>".
PORT_SHARE_ENV = "SGLANG_OVERLAY_TEST_PORT_SHARE"

# Its own generator: SGLang seeds the global one. Ports handed out stay taken for this process,
# so two picks can never return the same port before either is bound.
_port_random = random.SystemRandom()
_handed_out: set[int] = set()


def _ports_below_ephemeral() -> range:
    ports = range(10000, 30000)
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        if low > 12000:
            ports = range(10000, low)
    return session_share(ports, os.environ.get(PORT_SHARE_ENV))


def parse_share(share: str | None) -> tuple[int, int]:
    """``share`` = "<index>/<count>" as numbers; (0, 1) when unset (the only session)."""
    if not share:
        return 0, 1
    try:
        index, count = (int(part) for part in share.split("/"))
        if not 0 <= index < count:
            raise ValueError
    except ValueError:
        raise ValueError(f"{PORT_SHARE_ENV}={share!r}: expected <index>/<count>") from None
    return index, count


def session_share(ports: range, share: str | None) -> range:
    """This session's slice of ``ports`` for ``share`` = "<index>/<count>" (all of it if unset)."""
    index, count = parse_share(share)
    width = len(ports) // count
    return range(ports.start + index * width, ports.start + (index + 1) * width)


def free_port_range(width: int) -> int:
    """A base port whose next ``width`` ports are free right now."""
    ports = _ports_below_ephemeral()
    for _ in range(200):
        base = _port_random.randrange(ports.start, ports.stop - width)
        if _handed_out.intersection(range(base, base + width)):
            continue
        socks = []
        try:
            for offset in range(width):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", base + offset))
            _handed_out.update(range(base, base + width))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {width} consecutive free ports in {ports}")


def free_port() -> int:
    return free_port_range(1)
