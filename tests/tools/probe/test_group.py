"""``probe --group``: whole-group checks over real native metadata servers as the nodes.

Each node is the overlay's native server (``_native.start_metadata_server``) serving a
snapshot built by the core builder from real, bound stand-in publishers; failing groups are
made the way they fail in the field (a publisher missing, a rank on two nodes, a node down,
nodes of two groups mixed).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator

import pytest
import zmq
from probe_nodes import closed_port, run_cli
from sglang_sidecar_overlay._native import start_metadata_server
from sglang_sidecar_overlay.contract.server_info import render_server_info
from sglang_sidecar_overlay.tools import probe
from sglang_sidecar_overlay.tools.probe.group import (
    expected_node_rank,
    is_local_host,
    run_group_probe,
)
from sglang_sidecar_overlay.tools.selftest import StandInPublisher, node_snapshot

Edit = Callable[[dict], None]


@contextlib.contextmanager
def group(*nodes: tuple[int, tuple[int, ...], Edit | None]) -> Iterator[list[str]]:
    """Serve one node per ``(node_rank, publisher ranks, edit)``; yields their HOST:PORTs.

    The snapshot is the selftest's (nnodes 2, attention DP 4, legacy dp_size on); ``edit``
    changes it before it is served.
    """
    context = zmq.Context()
    with contextlib.ExitStack() as stack:
        stack.callback(context.term)
        targets = []
        for node_rank, ranks, edit in nodes:
            publishers = []
            for rank in ranks:
                pub = StandInPublisher(context, rank)
                stack.callback(pub.close)
                publishers.append(pub)
            info = node_snapshot(publishers, legacy_dp_size=True, node_rank=node_rank)
            if edit is not None:
                edit(info)
            server = stack.enter_context(
                start_metadata_server("127.0.0.1", 0, render_server_info(info))
            )
            server.set_serving(True)
            targets.append(probe.grpc_target(server.host, server.port))
        yield targets


def errors(report) -> dict[str, str]:
    """Error messages by field; several on one field are joined with `` | ``."""
    found: dict[str, str] = {}
    for finding in report.findings:
        if finding.level == probe.ERROR:
            field = finding.field or finding.check
            found[field] = (
                f"{found[field]} | {finding.message}" if field in found else finding.message
            )
    return found


def test_a_complete_group_passes_in_any_order() -> None:
    with group((0, (0, 1), None), (1, (2, 3), None)) as (leader, follower):
        report = run_group_probe([follower, leader], timeout=10)
    assert report.ok, [(f.field, f.message) for f in report.findings]
    assert report.exit_code() == 0
    assert report.rank_space_size == 4
    assert report.owners == {
        0: [(0, leader)],
        1: [(0, leader)],
        2: [(1, follower)],
        3: [(1, follower)],
    }
    ok = [f.message for f in report.findings if f.level == probe.OK]
    assert ok and "ranks 0..3 each advertised exactly once" in ok[0]
    as_json = report.to_json()
    assert as_json["ok"] is True and as_json["ranks"]["3"] == [{"node_rank": 1, "target": follower}]
    assert [node["target"] for node in as_json["nodes"]] == [follower, leader]


def test_a_follower_whose_publisher_is_missing_fails_by_rank_and_node() -> None:
    with group((0, (0, 1), None), (1, (2,), None)) as (leader, follower):
        report = run_group_probe([leader, follower], timeout=10)
    assert not report.ok and report.exit_code() == 1
    assert errors(report) == {
        "rank 3": f"no node advertises it; expected on node_rank 1 ({follower}): "
        "is its publisher missing?"
    }
    # Each node on its own is fine: only the group view finds the hole.
    assert all(node.ok for node in report.nodes)


def test_a_rank_advertised_by_two_nodes_names_both() -> None:
    with group((0, (0, 1), None), (1, (1, 2, 3), None)) as (leader, follower):
        report = run_group_probe([leader, follower], timeout=10)
    assert errors(report) == {
        "rank 1": f"advertised more than once: by node_rank 0 ({leader}), node_rank 1 ({follower})"
    }
    assert report.exit_code() == 1


def test_a_node_that_does_not_answer_loses_its_ranks_by_name() -> None:
    down = f"127.0.0.1:{closed_port()}"
    with group((0, (0, 1), None)) as (leader,):
        report = run_group_probe([leader, down], timeout=5)
    found = errors(report)
    assert found[down].startswith("not probed: ")
    for rank in (2, 3):
        assert found[f"rank {rank}"] == (
            f"no node advertises it; expected on node_rank 1 ({down}, not answering): "
            "is its publisher missing?"
        )
    assert found["node_rank"] == "node_rank 1 of 2: no node given answered as it"
    assert report.exit_code() == 1


def test_nothing_answering_is_exit_3() -> None:
    report = run_group_probe([f"127.0.0.1:{closed_port()}"], timeout=2)
    assert report.exit_code() == 3


def _other_group(info: dict) -> None:
    info["dist_init_addr"] = "10.9.9.9:5000"
    for source in info["kv_event_sources"]:
        source["topic"] = "other"


def test_nodes_of_two_groups_are_told_apart() -> None:
    with group((0, (0, 1), None), (1, (2, 3), _other_group)) as (leader, follower):
        report = run_group_probe([leader, follower], timeout=10)
    found = errors(report)
    assert found["dist_init_addr"] == (
        "differs across nodes (one dist_init_addr per group): "
        f"'127.0.0.1:5000' on node_rank 0 ({leader}); '10.9.9.9:5000' on node_rank 1 ({follower})"
    )
    assert found["topic"] == (
        "differs across ranks (one topic per group): 'kv-selftest' on rank 0, rank 1; "
        "'other' on rank 2, rank 3"
    )


def _rank_space_of_8(info: dict) -> None:
    info["kv_event_rank_space"].update(size=8, attn_dp_size=8)
    info["attn_dp_size"] = 8
    info["dp_size"] = 8
    info["kv_events"]["dp_size"] = 8


def test_duplicate_node_rank_and_rank_space_mismatch() -> None:
    with group((0, (0, 1), None), (0, (2, 3), _rank_space_of_8)) as (first, second):
        report = run_group_probe([first, second], timeout=10)
    found = errors(report)
    assert found["node_rank"] == (
        f"node_rank 0 is claimed by 2 nodes: {first}, {second} | "
        "node_rank 1 of 2: no node given answered as it"
    )
    assert found["kv_event_rank_space"].startswith("one rank space per group, got: ")
    assert "size 4 (system_dp 1 × attn_dp 4)" in found["kv_event_rank_space"]
    assert "size 8 (system_dp 1 × attn_dp 8)" in found["kv_event_rank_space"]
    # Two leaders: no consumer can tell what the group registers.
    assert [v.reason for v in report.consumers] == [
        f"{name} cannot tell the leader's registration: 2 nodes answer as node_rank 0"
        for name in ("dynamo-1.6", "dynamo-1.7")
    ]


def test_an_unhealthy_node_fails_the_group() -> None:
    context = zmq.Context()
    with contextlib.ExitStack() as stack:
        stack.callback(context.term)
        pubs = [StandInPublisher(context, rank) for rank in (2, 3)]
        for pub in pubs:
            stack.callback(pub.close)
        info = node_snapshot(pubs, legacy_dp_size=True)
        server = stack.enter_context(
            start_metadata_server("127.0.0.1", 0, render_server_info(info))
        )
        server.set_serving(False)
        follower = probe.grpc_target(server.host, server.port)
        with group((0, (0, 1), None)) as (leader,):
            report = run_group_probe([leader, follower], timeout=10)
    assert errors(report) == {
        f"node_rank 1 ({follower})": "fails its own probe (1 error(s), 0 warning(s))"
    }
    node = next(node for node in report.nodes if node.target == follower)
    assert node.health["status"] == "NOT_SERVING"


@pytest.mark.parametrize(
    ("size", "nnodes", "expected"),
    [
        (4, 2, [0, 0, 1, 1]),
        (2, 4, [0, 2]),
        (1, 2, [0]),
        (3, 3, [0, 1, 2]),
        (8, 4, [0, 0, 1, 1, 2, 2, 3, 3]),
    ],
)
def test_expected_node_rank_spreads_ranks_in_order(
    size: int, nnodes: int, expected: list[int]
) -> None:
    assert [expected_node_rank(rank, size, nnodes) for rank in range(size)] == expected


def test_local_hosts() -> None:
    assert is_local_host("127.0.0.1") and is_local_host("localhost")
    # TEST-NET-1 is never assigned to this machine.
    assert not is_local_host("192.0.2.1")
    assert not is_local_host("no-such-host.invalid")


# --- the CLI --------------------------------------------------------------------------------


def test_cli_group_pass_fail_and_json() -> None:
    with group((0, (0, 1), None), (1, (2,), None)) as (leader, follower):
        failed = run_cli("probe", "--group", follower, leader)
        as_json = run_cli("probe", "--group", leader, follower, "--json")
    assert failed.returncode == 1, failed.stderr
    assert f"no node advertises it; expected on node_rank 1 ({follower})" in failed.stdout
    assert f"node_rank 1  {follower}  ranks 2" in failed.stdout
    assert failed.stdout.rstrip().splitlines()[-1].startswith("FAIL (1 error")
    assert as_json.returncode == 1
    parsed = json.loads(as_json.stdout)
    assert parsed["ok"] is False and parsed["errors"] == 1
    assert [c["field"] for c in parsed["checks"] if c["level"] == "error"] == ["rank 3"]

    with group((0, (0, 1), None), (1, (2, 3), None)) as (leader, follower):
        passed = run_cli("probe", "--group", follower, leader)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert passed.stdout.rstrip().splitlines()[-1] == "PASS (0 errors, 0 warnings)"


def test_cli_needs_exactly_one_of_target_and_group() -> None:
    both = run_cli("probe", "127.0.0.1:1", "--group", "127.0.0.1:2")
    neither = run_cli("probe")
    for result in (both, neither):
        assert result.returncode == 2
        assert "give one HOST:PORT or --group HOST:PORT HOST:PORT" in result.stderr
