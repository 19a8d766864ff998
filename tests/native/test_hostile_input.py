"""The installed native metadata server under hostile clients, over real loopback sockets.

Each test starts the server in its own process (``hostile_patterns.server_process``), runs one
hostile pattern from ``hostile_patterns`` while a well-behaved client polls GetServerInfo on an
established connection, and asserts behaviour: what the server did to the hostile client, that
it is still alive, that its resident memory stayed within idle + 32 MiB, and that the
well-behaved client saw no error. Nothing here asserts latency.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sglang_sidecar_overlay._native import DEFAULT_LIMITS, MAX_REFLECTION_STREAMS
from testkit import hostile_patterns as hp

MEMORY_BOUND_MIB = 32
SOAK_CLIENTS = 64
SOAK_CALLS_PER_CLIENT = 20_000
SOAK_SNAPSHOT_BYTES = 512


@pytest.fixture
def server() -> Iterator[hp.ServerProcess]:
    with hp.server_process("ours") as srv:
        yield srv


def assert_unharmed(run: hp.Run) -> None:
    assert run.alive, f"{run.pattern}: the server process died"
    assert run.legit_errors == [], f"{run.pattern}: legitimate client failed: {run.legit_errors}"
    assert run.legit_calls > 0
    assert run.peak_delta_mib <= MEMORY_BOUND_MIB, (
        f"{run.pattern}: resident memory rose {run.peak_delta_mib:.1f} MiB over idle"
    )


@pytest.mark.parametrize("pattern", ["garbage", "http1", "preface-garbage"])
def test_bytes_that_are_not_http2_get_the_connection_closed(
    server: hp.ServerProcess, pattern: str
) -> None:
    run = hp.run_pattern(server, pattern)
    assert run.outcome.figures["closed"], run.outcome.status
    assert_unharmed(run)


def test_http1_gets_no_reply(server: hp.ServerProcess) -> None:
    run = hp.run_pattern(server, "http1")
    assert run.outcome.status == "closed, no reply"
    assert_unharmed(run)


def test_oversized_headers_are_refused(server: hp.ServerProcess) -> None:
    run = hp.run_pattern(server, "oversized-headers")
    assert not run.outcome.figures["answered"], run.outcome.status
    assert_unharmed(run)


def test_a_2_gib_streamed_body_is_refused_early_with_a_grpc_error(
    server: hp.ServerProcess,
) -> None:
    run = hp.run_pattern(server, "huge-body")
    assert run.outcome.figures["code"] == "RESOURCE_EXHAUSTED", run.outcome.status
    # Refused at the first message header: far less than the 2 GiB offered left the client.
    assert run.outcome.figures["sent_bytes"] < 64 * hp.MIB, run.outcome.status
    assert_unharmed(run)


def test_10000_concurrent_connections_are_capped(server: hp.ServerProcess) -> None:
    run = hp.run_pattern(server, "connection-flood", count=10_000)
    assert run.outcome.figures["held_open"] <= DEFAULT_LIMITS["max_connections"], run.outcome.status
    assert_unharmed(run)


def test_a_slowloris_client_is_dropped_by_the_handshake_timeout(
    server: hp.ServerProcess,
) -> None:
    run = hp.run_pattern(server, "slowloris", max_seconds=4 * DEFAULT_LIMITS["handshake_timeout_s"])
    assert run.outcome.figures["dropped_after"] is not None, run.outcome.status
    assert_unharmed(run)


def test_resets_in_the_middle_of_calls_leave_the_server_serving(
    server: hp.ServerProcess,
) -> None:
    run = hp.run_pattern(server, "resets")
    assert_unharmed(run)
    assert hp.grpc_call(server.address)


def test_unread_reflection_streams_are_capped_and_stay_within_the_memory_bound(
    server: hp.ServerProcess,
) -> None:
    run = hp.run_pattern(server, "reflection-streams")
    assert run.outcome.figures["streams"] == 500, run.outcome.status
    # Only the streams beyond the cap are refused at once: the first ones hold their places.
    assert run.outcome.figures["refused"] == 500 - MAX_REFLECTION_STREAMS, run.outcome.status
    assert_unharmed(run)


# 1.28 million calls: about a minute on an idle 2-core machine, several when it is shared.
@pytest.mark.timeout(900)
def test_soak_64_clients_x_20000_calls_without_errors_or_memory_growth() -> None:
    json_info = hp.snapshot(SOAK_SNAPSHOT_BYTES)
    with hp.server_process("ours", SOAK_SNAPSHOT_BYTES) as srv:
        report = hp.soak(srv, json_info, SOAK_CLIENTS, SOAK_CALLS_PER_CLIENT)
        assert srv.alive()
    assert report["errors"] == 0, report["first_error"]
    assert report["wrong_size"] == 0
    assert report["requests"] == SOAK_CLIENTS * SOAK_CALLS_PER_CLIENT
    assert report["samples"] >= 8, "too few memory samples to compare quarters"
    assert report["growth"] <= 0.05, report
