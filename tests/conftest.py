"""Shared fixtures: ZMQ contexts and sockets torn down even when a test fails."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

# The test tree (helpers and data live at its top, next to this file) and the repository.
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


@pytest.fixture
def zmq_context() -> Iterator[zmq.Context]:
    """A private context, destroyed (linger 0) at teardown even when the test failed."""
    context = zmq.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


@pytest.fixture
def zmq_socket(zmq_context: zmq.Context) -> Iterator[Callable[[int], zmq.Socket]]:
    """A factory of linger-0 sockets, all closed at teardown.

    The fixture holds a reference to each socket so none is garbage-collected unclosed
    (pyzmq warns, and warnings are errors here) between the test's return and teardown.
    """
    sockets: list[zmq.Socket] = []

    def make(socket_type: int) -> zmq.Socket:
        sock = zmq_context.socket(socket_type)
        sock.setsockopt(zmq.LINGER, 0)
        sockets.append(sock)
        return sock

    try:
        yield make
    finally:
        for sock in sockets:
            sock.close(linger=0)


def has_ipv6_loopback() -> bool:
    """Whether this machine can bind ``::1`` (containers often run without IPv6)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A native metadata server on a free loopback port serving the test module's ``SNAPSHOT``,
    shut down at teardown."""
    from sglang_sidecar_overlay._native import start_metadata_server

    srv = start_metadata_server("127.0.0.1", 0, request.module.SNAPSHOT)
    try:
        yield srv
    finally:
        srv.shutdown()
