"""Follower metadata-server lifecycle with real processes and the native server.

Real child processes stand for a node's schedulers; a real grpcio client reads
GetServerInfo and grpc.health.v1 from the native server the core starts.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from sglang_sidecar_overlay.server.follower import DEFAULT_LINGER_S, start_follower_server
from sglang_sidecar_overlay.sidecar.proctree import read_stat
from sglang_sidecar_overlay.tools.probe import wire as _grpc_wire

SERVING, NOT_SERVING = 1, 2


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


@pytest.fixture
def schedulers() -> Iterator[list[subprocess.Popen]]:
    procs = [_sleeper(), _sleeper()]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def _health(port: int) -> int | None:
    """The health status of "", or None when nothing listens (the connection is refused:
    UNAVAILABLE); any other failure is raised, so a stalled or wrong server is not "nothing"."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary(
            _grpc_wire.HEALTH_CHECK_PATH,
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        try:
            reply = check(_grpc_wire.encode_health_check_request(""), timeout=2.0)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                return None
            raise
    return _grpc_wire.decode_health_check_response(reply)


def _server_info(port: int) -> dict:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            _grpc_wire.GET_SERVER_INFO_PATH,
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        reply = call(_grpc_wire.encode_get_server_info_request(), timeout=5.0)
    return json.loads(_grpc_wire.decode_get_server_info_response(reply))


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_snapshot_then_serving_then_not_serving_when_schedulers_exit(schedulers):
    snapshot = {"node_rank": 1, "kv_event_sources": []}
    # A linger far past the deadlines below: the server stops because the last scheduler
    # went, not because the linger ran out, and stays up NOT_SERVING until then.
    follower = start_follower_server(
        "127.0.0.1", 0, json.dumps(snapshot), [p.pid for p in schedulers], linger_s=600.0
    )
    try:
        assert _server_info(follower.port) == snapshot
        assert _health(follower.port) == SERVING
        schedulers[0].kill()
        schedulers[0].wait(timeout=10)
        _wait_for(lambda: _health(follower.port) == NOT_SERVING, 30, "NOT_SERVING")
        assert follower.is_alive() and _server_info(follower.port) == snapshot
        schedulers[1].kill()
        schedulers[1].wait(timeout=10)
        _wait_for(lambda: not follower.is_alive(), 30, "server stopped")
        assert _health(follower.port) is None
        assert follower.exited_pid == schedulers[0].pid
    finally:
        follower.stop()


def test_lone_crash_stops_after_linger(schedulers):
    follower = start_follower_server(
        "127.0.0.1", 0, "{}", [p.pid for p in schedulers], linger_s=DEFAULT_LINGER_S
    )
    try:
        schedulers[1].kill()
        # First NOT_SERVING with the port still open (the linger), then stopped while the
        # other scheduler still runs: the linger ended it, not the last scheduler's exit.
        _wait_for(lambda: _health(follower.port) == NOT_SERVING, 30, "NOT_SERVING")
        _wait_for(lambda: not follower.is_alive(), 60, "server stopped after linger")
        assert schedulers[0].poll() is None
        assert _health(follower.port) is None
    finally:
        follower.stop()


def test_stop_is_idempotent_and_closes_the_port(schedulers):
    follower = start_follower_server("127.0.0.1", 0, "{}", [schedulers[0].pid])
    port = follower.port
    follower.stop()
    follower.stop()
    follower.shutdown()
    assert not follower.is_alive()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_a_second_stop_returns_only_after_the_first_one_finished(schedulers):
    # The scheduler watcher may be stopping the sidecar when the node's main thread stops the
    # server on its way out: the main thread must not exit under that stop.
    follower = start_follower_server("127.0.0.1", 0, "{}", [schedulers[0].pid])
    entered, release = threading.Event(), threading.Event()
    order: list[str] = []

    def slow_sidecar_stop() -> None:
        entered.set()
        release.wait(60)
        order.append("sidecar stopped")

    follower.add_before_stop(slow_sidecar_stop)
    first = threading.Thread(target=follower.stop, daemon=True)
    first.start()
    assert entered.wait(30)
    second = threading.Thread(
        target=lambda: (follower.stop(), order.append("second returned")), daemon=True
    )
    second.start()
    second.join(0.5)
    assert second.is_alive() and order == []  # still waiting for the first stop
    release.set()
    first.join(30)
    second.join(30)
    assert not first.is_alive() and not second.is_alive()
    assert order == ["sidecar stopped", "second returned"]
    assert not follower.is_alive()


def test_a_stop_reentered_by_the_stopping_thread_returns(schedulers):
    # A signal handler (SIGQUIT on the crash path) re-entering stop() on the thread that is
    # already stopping must not wait for itself.
    follower = start_follower_server("127.0.0.1", 0, "{}", [schedulers[0].pid])
    reentered: list[bool] = []
    follower.add_before_stop(lambda: (follower.stop(), reentered.append(True)))
    done = threading.Thread(target=follower.stop, daemon=True)
    done.start()
    done.join(30)
    assert not done.is_alive() and reentered == [True]


def test_bind_failure_names_the_address(schedulers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError) as excinfo:
            start_follower_server("127.0.0.1", port, "{}", [schedulers[0].pid])
    assert f"127.0.0.1:{port}" in str(excinfo.value)
    assert excinfo.value.errno is not None


def test_scheduler_already_gone_never_serves(schedulers):
    schedulers[0].kill()
    schedulers[0].wait(timeout=10)
    with pytest.raises(RuntimeError, match=rf"scheduler process {schedulers[0].pid} exited"):
        start_follower_server("127.0.0.1", 0, "{}", [p.pid for p in schedulers])


def test_scheduler_exited_but_not_reaped_never_serves(schedulers):
    """A crash between readiness and the server's start leaves an unreaped child."""
    schedulers[1].kill()
    _wait_for(
        lambda: _proc_state(schedulers[1].pid) == "Z", 10, "the killed scheduler to be a zombie"
    )
    with pytest.raises(RuntimeError, match=rf"scheduler process {schedulers[1].pid} exited"):
        start_follower_server("127.0.0.1", 0, "{}", [p.pid for p in schedulers])


def _proc_state(pid: int) -> str:
    stat = read_stat(pid)
    assert stat is not None, f"process {pid} is gone"
    return stat.state
