"""What each released consumer would register: the rules alone, one node, a group, the CLI.

The four reply shapes are what a TP2 / attention-DP 2 engine over two nodes (rank space 2,
rank 0 on node_rank 0, rank 1 on node_rank 1) has served: stock SGLang 0.5.22+ (``dp_size=1,
attn_dp_size=2``), the overlay's first dp_size switch (``dp_size=2`` with ``attn_dp_size=2``
kept), its both-consumers shape (``dp_size=2, attn_dp_size=1``) and SGLang 0.5.19-0.5.21
(``dp_size=2``, no ``attn_dp_size``). The rules are checked on plain replies; the probe and the
CLI on replies served over real gRPC (grpcio stand-ins for one node, the overlay's native
metadata server for groups) with real bound publishers behind the advertised endpoints.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from probe_nodes import errors_of, grpc_node, run_cli, warnings_of
from probe_nodes import stand_in_publishers as publishers
from sglang_sidecar_overlay._native import start_metadata_server
from sglang_sidecar_overlay.contract.server_info import render_server_info
from sglang_sidecar_overlay.tools import probe
from sglang_sidecar_overlay.tools.probe import consumers
from sglang_sidecar_overlay.tools.probe.group import run_group_probe
from sglang_sidecar_overlay.tools.selftest import StandInPublisher, node_snapshot

SERVING = probe.wire.ServingStatus.SERVING
DYNAMO_SIDECAR = "dynamo.sglang.sidecar"
ADVICE = (
    "leave SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE unset on nodes whose --sidecar is "
    "dynamo.sglang.sidecar, or set it to 1 on every node (the shape every Dynamo version "
    "registers exactly)"
)

# (dp_size, attn_dp_size or None for absent)
STOCK_0_5_22 = (1, 2)
FIRST_SWITCH = (2, 2)
BOTH_CONSUMERS = (2, 1)
BEFORE_0_5_22 = (2, None)
SHAPES = {
    "stock-0.5.22": STOCK_0_5_22,
    "first-switch": FIRST_SWITCH,
    "both-consumers": BOTH_CONSUMERS,
    "before-0.5.22": BEFORE_0_5_22,
}
# consumer -> shape -> (registers, ok) for a group and for each node on its own.
REGISTERS = {
    "dynamo-1.6": {
        "stock-0.5.22": (1, False),
        "first-switch": (2, True),
        "both-consumers": (2, True),
        "before-0.5.22": (2, True),
    },
    "dynamo-1.7": {
        "stock-0.5.22": (2, True),
        "first-switch": (4, False),
        "both-consumers": (2, True),
        "before-0.5.22": (2, True),
    },
}
PHANTOM_1_7 = (
    "dynamo-1.7 would register 4 DP ranks for a rank space of 2: ranks 2, 3 are phantom "
    "(dp_size 2 × attn_dp_size 2)"
)
MISSING_1_6 = (
    "dynamo-1.6 would register 1 DP rank for a rank space of 2: rank 1 is missing (dp_size 1)"
)


def reply(node_rank: int, shape: tuple[int, int | None], **extra: Any) -> dict:
    """A node's reply of the TP2 / attention-DP 2 group: the widths and its one source."""
    dp_size, attn_dp_size = shape
    info: dict[str, Any] = {
        "node_rank": node_rank,
        "nnodes": 2,
        "dp_size": dp_size,
        "kv_event_sources": [{"dp_rank": node_rank}],
        "kv_event_rank_space": {
            "size": 2,
            "system_dp_size": 1,
            "attn_dp_size": 2,
            "local_ranks": [node_rank],
        },
    }
    if attn_dp_size is not None:
        info["attn_dp_size"] = attn_dp_size
    info.update(extra)
    return info


def group_of(shape: tuple[int, int | None]) -> list[tuple[str, dict]]:
    return [("node_rank 0 (a:1)", reply(0, shape)), ("node_rank 1 (b:1)", reply(1, shape))]


def by_name(verdicts: list[consumers.Verdict]) -> dict[str, consumers.Verdict]:
    return {verdict.consumer: verdict for verdict in verdicts}


# --- the rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_rule_on_each_shape_for_a_group(shape: str) -> None:
    verdicts = by_name(consumers.group_verdicts(group_of(SHAPES[shape])))
    assert {name: (v.registers, v.ok) for name, v in verdicts.items()} == {
        name: table[shape] for name, table in REGISTERS.items()
    }
    assert all(v.rank_space == 2 for v in verdicts.values())
    assert all((v.reason is None) == v.ok for v in verdicts.values())


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("node_rank", [0, 1])
def test_each_rule_on_each_shape_for_one_node(shape: str, node_rank: int) -> None:
    verdicts = by_name(consumers.node_verdicts(reply(node_rank, SHAPES[shape])))
    assert {name: (v.registers, v.ok) for name, v in verdicts.items()} == {
        name: table[shape] for name, table in REGISTERS.items()
    }


def test_stock_0_5_22_dynamo_1_6_rejects_the_follower_and_misses_rank_1() -> None:
    group = by_name(consumers.group_verdicts(group_of(STOCK_0_5_22)))["dynamo-1.6"]
    assert group.reason == (
        'dynamo-1.6 rejects node_rank 1 (b:1): "KV source rank 1 is outside dp_size 1"; '
        + MISSING_1_6
    )
    follower = by_name(consumers.node_verdicts(reply(1, STOCK_0_5_22)))["dynamo-1.6"]
    assert follower.reason == (
        'dynamo-1.6 rejects this node: "KV source rank 1 is outside dp_size 1" '
        "(rank 1 never routed); " + MISSING_1_6
    )
    # The leader's own sources are not checked by the consumer: its view is the registration.
    leader = by_name(consumers.node_verdicts(reply(0, STOCK_0_5_22)))["dynamo-1.6"]
    assert leader.reason == MISSING_1_6
    # Not even when it carries rank 1 itself (both ranks on one node, nnodes 1): rank 1 is
    # left out of the registration, not refused.
    single = reply(0, STOCK_0_5_22, nnodes=1, kv_event_sources=[{"dp_rank": 0}, {"dp_rank": 1}])
    assert by_name(consumers.node_verdicts(single))["dynamo-1.6"].reason == MISSING_1_6
    alone = by_name(consumers.group_verdicts([("node_rank 0 (a:1)", single)]))["dynamo-1.6"]
    assert alone.reason == MISSING_1_6


def test_first_switch_dynamo_1_7_registers_two_phantom_ranks() -> None:
    group = by_name(consumers.group_verdicts(group_of(FIRST_SWITCH)))["dynamo-1.7"]
    assert group.reason == PHANTOM_1_7
    node = by_name(consumers.node_verdicts(reply(1, FIRST_SWITCH)))["dynamo-1.7"]
    assert node.reason == PHANTOM_1_7


def test_ok_lines_say_what_is_registered() -> None:
    summaries = [v.summary for v in consumers.group_verdicts(group_of(BEFORE_0_5_22))]
    assert summaries == [
        "dynamo-1.6 registers 2 DP ranks = rank space 2 (dp_size 2)",
        "dynamo-1.7 registers 2 DP ranks = rank space 2 (dp_size 2, no attn_dp_size)",
    ]


def test_a_follower_that_disagrees_with_the_leader_is_rejected_in_each_consumers_words() -> None:
    nodes = [
        ("node_rank 0 (a:1)", reply(0, BOTH_CONSUMERS)),
        ("node_rank 1 (b:1)", reply(1, (3, 1))),
    ]
    verdicts = by_name(consumers.group_verdicts(nodes))
    assert verdicts["dynamo-1.6"].reason == (
        'dynamo-1.6 rejects node_rank 1 (b:1): "GetServerInfo dp_size does not match leader '
        'registration" (its dp_size 3, the leader registered 2); rank 1 never routed'
    )
    assert verdicts["dynamo-1.7"].reason == (
        'dynamo-1.7 rejects node_rank 1 (b:1): "GetServerInfo deployment DP size does not match '
        'leader registration" (its deployment DP size 3, the leader registered 2); '
        "rank 1 never routed"
    )
    assert verdicts["dynamo-1.7"].registers == 2


def test_the_follower_rank_check_comes_before_the_leader_comparison() -> None:
    # Dynamo 1.7 multiplies: dp_size 1 × attn_dp_size 2 on the follower equals the leader's 2 × 1.
    nodes = [
        ("node_rank 0 (a:1)", reply(0, BOTH_CONSUMERS)),
        ("node_rank 1 (b:1)", reply(1, STOCK_0_5_22)),
    ]
    verdicts = by_name(consumers.group_verdicts(nodes))
    assert verdicts["dynamo-1.7"].ok
    assert verdicts["dynamo-1.6"].reason == (
        'dynamo-1.6 rejects node_rank 1 (b:1): "KV source rank 1 is outside dp_size 1"; '
        "rank 1 never routed"
    )


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ([("node_rank 1 (b:1)", reply(1, BOTH_CONSUMERS))], "no node answered as node_rank 0"),
        (
            [("a", reply(0, BOTH_CONSUMERS)), ("b", reply(0, BOTH_CONSUMERS))],
            "2 nodes answer as node_rank 0",
        ),
    ],
)
def test_no_single_leader_means_no_registration(nodes: list, expected: str) -> None:
    for verdict in consumers.group_verdicts(nodes):
        assert not verdict.ok and verdict.registers is None
        assert verdict.reason == (
            f"{verdict.consumer} cannot tell the leader's registration: {expected}"
        )


def test_unreadable_widths_and_hostile_sizes_stay_one_short_line() -> None:
    no_dp = by_name(consumers.node_verdicts(reply(0, BOTH_CONSUMERS, dp_size="2")))
    assert no_dp["dynamo-1.6"].reason == (
        "dynamo-1.6 cannot register this node: dp_size '2' is no positive dp_size"
    )
    assert no_dp["dynamo-1.6"].registers is None
    # A width of 10**18 is described by its ends, never listed (nor allocated).
    huge = by_name(consumers.node_verdicts(reply(0, (10**18, None))))["dynamo-1.6"]
    assert huge.reason == (
        f"dynamo-1.6 would register {10**18} DP ranks for a rank space of 2: "
        f"ranks 2..{10**18 - 1} are phantom (dp_size {10**18})"
    )
    # A bool is no width (a typed consumer refuses it too).
    assert by_name(consumers.node_verdicts(reply(0, (True, None))))["dynamo-1.6"].registers is None


def test_the_rank_space_falls_back_to_the_widths_without_kv_event_rank_space() -> None:
    info = reply(1, BEFORE_0_5_22, enable_dp_attention=True)
    del info["kv_event_rank_space"]
    verdicts = by_name(consumers.node_verdicts(info))
    assert {name: (v.rank_space, v.ok) for name, v in verdicts.items()} == {
        "dynamo-1.6": (2, True),
        "dynamo-1.7": (2, True),
    }


# --- choosing the judging consumers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["dynamo-1.6"], ["dynamo-1.6"]),
        (["dynamo-1.7"], ["dynamo-1.7"]),
        (["dynamo"], ["dynamo-1.6", "dynamo-1.7"]),
        (["any"], ["dynamo-1.6", "dynamo-1.7"]),
        (["dynamo-1.7,dynamo-1.6"], ["dynamo-1.6", "dynamo-1.7"]),
        (["dynamo-1.7", "dynamo-1.7"], ["dynamo-1.7"]),
    ],
)
def test_consumer_names(values: list[str], expected: list[str]) -> None:
    names = [name for value in values for name in consumers.parse_consumers(value)]
    assert consumers.select(names, [reply(0, STOCK_0_5_22)]).names == expected


@pytest.mark.parametrize("value", ["dynamo-2.0", "", " , ", "dynamo,vllm"])
def test_unknown_consumer_names_are_refused(value: str) -> None:
    with pytest.raises(
        ValueError, match=re.escape("choose from dynamo-1.6, dynamo-1.7, dynamo, any")
    ):
        consumers.parse_consumers(value)


@pytest.mark.parametrize(
    ("sidecars", "expected", "source"),
    [
        (
            [DYNAMO_SIDECAR],
            ["dynamo-1.6", "dynamo-1.7"],
            "the node's sidecar 'dynamo.sglang.sidecar'",
        ),
        ([None], [], "no --consumer, no sidecar"),
        (["my.sidecar"], [], "no --consumer; sidecar 'my.sidecar' is no consumer the probe knows"),
        ([["dynamo.sglang.sidecar"]], [], "no --consumer, no sidecar"),
        (
            [None, DYNAMO_SIDECAR],
            ["dynamo-1.6", "dynamo-1.7"],
            "the node's sidecar 'dynamo.sglang.sidecar'",
        ),
    ],
)
def test_without_the_option_the_nodes_sidecar_decides(
    sidecars: list, expected: list[str], source: str
) -> None:
    infos = [reply(0, STOCK_0_5_22, sidecar=sidecar) for sidecar in sidecars]
    selection = consumers.select(None, infos)
    assert selection.names == expected and selection.source == source


def test_only_judging_consumers_fail() -> None:
    verdicts = consumers.node_verdicts(reply(1, FIRST_SWITCH))
    judged = consumers.consumer_findings(verdicts, consumers.select(["dynamo"], []))
    assert [(f.level, f.message) for f in judged] == [
        ("info", "judged for dynamo-1.6, dynamo-1.7 (--consumer)"),
        ("ok", "dynamo-1.6 registers 2 DP ranks = rank space 2 (dp_size 2)"),
        ("error", f"{PHANTOM_1_7}; {ADVICE}"),
    ]
    told = consumers.consumer_findings(verdicts, consumers.select(None, []))
    assert [(f.level, f.message) for f in told] == [
        ("info", "information only, no consumer judges this probe (no --consumer, no sidecar)"),
        ("info", "dynamo-1.6 registers 2 DP ranks = rank space 2 (dp_size 2)"),
        ("info", PHANTOM_1_7),
    ]


# --- one node over gRPC ------------------------------------------------------------------------


def served_reply(
    pubs: list[StandInPublisher], node_rank: int, shape: tuple[int, int | None], **extra: Any
) -> dict:
    """The core builder's snapshot for ``pubs``, reshaped to the TP2 / attention-DP 2 group."""
    info = node_snapshot(pubs, legacy_dp_size=False, node_rank=node_rank)
    dp_size, attn_dp_size = shape
    info.update(tp_size=2, dp_size=dp_size, **extra)
    info.pop("attn_dp_size", None)
    if attn_dp_size is not None:
        info["attn_dp_size"] = attn_dp_size
    info["kv_event_rank_space"].update(size=2, system_dp_size=1, attn_dp_size=2)
    info["kv_events"]["dp_size"] = 2
    return info


def test_probe_reports_consumers_and_fails_only_for_the_judging_ones() -> None:
    with publishers(1) as pubs:
        info = served_reply(pubs, 1, STOCK_0_5_22)
        dynamo = dict(info, sidecar=DYNAMO_SIDECAR)
        with (
            grpc_node(json.dumps(info), health=SERVING) as plain,
            grpc_node(json.dumps(dynamo), health=SERVING) as inferred,
        ):
            told = probe.run_probe(plain, timeout=5)
            judged_16 = probe.run_probe(plain, timeout=5, consumers=["dynamo-1.6"])
            judged_17 = probe.run_probe(plain, timeout=5, consumers=["dynamo-1.7"])
            from_sidecar = probe.run_probe(inferred, timeout=5)
            overridden = probe.run_probe(inferred, timeout=5, consumers=["dynamo-1.7"])
    # Reported, never failing: no option and no known sidecar.
    assert told.ok and told.exit_code() == 0, errors_of(told.findings)
    assert warnings_of(told.findings) == {}
    lines = [f.message for f in told.findings if f.check == "consumers"]
    assert lines[0] == "information only, no consumer judges this probe (no --consumer, no sidecar)"
    assert lines[1].startswith('dynamo-1.6 rejects this node: "KV source rank 1 is outside')
    assert lines[2] == (
        "dynamo-1.7 registers 2 DP ranks = rank space 2 (dp_size 1 × attn_dp_size 2)"
    )
    assert told.to_json()["consumers"] == {
        "dynamo-1.6": {
            "registers": 1,
            "rank_space": 2,
            "ok": False,
            "reason": 'dynamo-1.6 rejects this node: "KV source rank 1 is outside dp_size 1" '
            "(rank 1 never routed); " + MISSING_1_6,
        },
        "dynamo-1.7": {"registers": 2, "rank_space": 2, "ok": True, "reason": None},
    }
    assert told.to_json()["consumers_selected"] == []
    # Judged: dynamo-1.6 fails the probe, dynamo-1.7 passes it.
    assert judged_16.exit_code() == 1
    assert errors_of(judged_16.findings) == {
        "consumers": 'dynamo-1.6 rejects this node: "KV source rank 1 is outside dp_size 1" '
        f"(rank 1 never routed); {MISSING_1_6}; {ADVICE}"
    }
    assert judged_17.ok and judged_17.to_json()["consumers_selected"] == ["dynamo-1.7"]
    # The node's sidecar names both Dynamo rules; --consumer overrides it.
    assert from_sidecar.exit_code() == 1
    assert from_sidecar.to_json()["consumers_selected"] == ["dynamo-1.6", "dynamo-1.7"]
    assert list(errors_of(from_sidecar.findings)) == ["consumers"]
    assert overridden.ok


def test_cli_exit_codes_and_json_with_and_without_consumer() -> None:
    with publishers(1) as pubs:
        info = served_reply(pubs, 1, FIRST_SWITCH)
        with grpc_node(json.dumps(info), health=SERVING) as target:
            plain = run_cli("probe", target)
            failed = run_cli("probe", target, "--consumer", "dynamo")
            passed = run_cli("probe", target, "--consumer", "dynamo-1.6")
            as_json = run_cli("probe", target, "--json", "--consumer", "dynamo-1.7,dynamo-1.6")
    assert plain.returncode == 0, plain.stdout
    assert line_of(plain.stdout, PHANTOM_1_7).split()[:2] == ["·", "consumers"]
    assert failed.returncode == 1, failed.stdout
    assert line_of(failed.stdout, f"{PHANTOM_1_7}; {ADVICE}").split()[:2] == ["✗", "consumers"]
    ok_16 = "dynamo-1.6 registers 2 DP ranks = rank space 2 (dp_size 2)"
    assert line_of(failed.stdout, ok_16).split()[:2] == ["✓", "consumers"]
    assert failed.stdout.rstrip().splitlines()[-1] == "FAIL (1 error, 0 warnings)"
    assert passed.returncode == 0, passed.stdout
    assert as_json.returncode == 1
    parsed = json.loads(as_json.stdout)
    assert parsed["consumers"] == {
        "dynamo-1.6": {"registers": 2, "rank_space": 2, "ok": True, "reason": None},
        "dynamo-1.7": {"registers": 4, "rank_space": 2, "ok": False, "reason": PHANTOM_1_7},
    }
    assert parsed["consumers_selected"] == ["dynamo-1.6", "dynamo-1.7"]
    assert parsed["errors"] == 1 and parsed["ok"] is False


def test_cli_refuses_unknown_consumers_and_consumer_with_watch() -> None:
    unknown = run_cli("probe", "127.0.0.1:1", "--consumer", "dynamo-2")
    assert unknown.returncode == 2
    assert "unknown consumer 'dynamo-2'; choose from dynamo-1.6, dynamo-1.7, dynamo, any" in (
        unknown.stderr
    )
    watch = run_cli("probe", "127.0.0.1:1", "--watch", "1", "--consumer", "dynamo")
    assert watch.returncode == 2
    assert "probe: --watch cannot be combined with --listen or --consumer" in watch.stderr


# --- a group over the native metadata server ---------------------------------------------------


@contextlib.contextmanager
def served_group(shape: tuple[int, int | None], **extra: Any) -> Iterator[list[str]]:
    """The two nodes (rank 0 on node_rank 0, rank 1 on node_rank 1); their HOST:PORTs."""
    with contextlib.ExitStack() as stack:
        targets = []
        for node_rank in (0, 1):
            pubs = stack.enter_context(publishers(node_rank))
            info = served_reply(pubs, node_rank, shape, **extra)
            server = stack.enter_context(
                start_metadata_server("127.0.0.1", 0, render_server_info(info))
            )
            server.set_serving(True)
            targets.append(probe.grpc_target(server.host, server.port))
        yield targets


def line_of(stdout: str, message: str) -> str:
    """The human output line that ends with ``message``: ``mark label  message``."""
    lines = [line for line in stdout.splitlines() if line.endswith(f"  {message}")]
    assert len(lines) == 1, stdout
    return lines[0]


def consumer_errors(report: Any) -> list[str]:
    return [f.message for f in report.findings if f.check == "consumers" and f.level == "error"]


def test_group_judged_by_option_or_sidecar() -> None:
    with served_group(STOCK_0_5_22) as (leader, follower):
        told = run_group_probe([follower, leader], timeout=10)
        judged = run_group_probe([follower, leader], timeout=10, consumers=["dynamo"])
        newer = run_group_probe([follower, leader], timeout=10, consumers=["dynamo-1.7"])
    assert told.ok and told.exit_code() == 0
    assert told.to_json()["consumers"]["dynamo-1.6"] == {
        "registers": 1,
        "rank_space": 2,
        "ok": False,
        "reason": f'dynamo-1.6 rejects node_rank 1 ({follower}): "KV source rank 1 is outside '
        f'dp_size 1"; {MISSING_1_6}',
    }
    assert told.to_json()["consumers"]["dynamo-1.7"]["ok"] is True
    # A node's own verdicts are information inside a group: only the group's judge.
    assert all(node.ok for node in told.nodes + judged.nodes)
    assert judged.exit_code() == 1
    assert consumer_errors(judged) == [
        f'dynamo-1.6 rejects node_rank 1 ({follower}): "KV source rank 1 is outside dp_size 1"; '
        f"{MISSING_1_6}; {ADVICE}"
    ]
    assert newer.ok and newer.to_json()["consumers_selected"] == ["dynamo-1.7"]

    with served_group(FIRST_SWITCH, sidecar=DYNAMO_SIDECAR) as (leader, follower):
        inferred = run_group_probe([leader, follower], timeout=10)
        older = run_group_probe([leader, follower], timeout=10, consumers=["dynamo-1.6"])
    assert inferred.exit_code() == 1
    assert consumer_errors(inferred) == [f"{PHANTOM_1_7}; {ADVICE}"]
    assert inferred.to_json()["consumers_selected"] == ["dynamo-1.6", "dynamo-1.7"]
    assert older.ok


def test_group_cli_both_consumers_shape_passes_any() -> None:
    with served_group(BOTH_CONSUMERS, sidecar=DYNAMO_SIDECAR) as (leader, follower):
        result = run_cli("probe", "--group", leader, follower, "--consumer", "any")
        as_json = run_cli("probe", "--group", leader, follower, "--json")
    assert result.returncode == 0, result.stdout
    ok_17 = "dynamo-1.7 registers 2 DP ranks = rank space 2 (dp_size 2 × attn_dp_size 1)"
    assert line_of(result.stdout, ok_17).split()[:2] == ["✓", "consumers"]
    assert result.stdout.rstrip().splitlines()[-1] == "PASS (0 errors, 0 warnings)"
    parsed = json.loads(as_json.stdout)
    assert as_json.returncode == 0
    assert parsed["consumers"] == {
        "dynamo-1.6": {"registers": 2, "rank_space": 2, "ok": True, "reason": None},
        "dynamo-1.7": {"registers": 2, "rank_space": 2, "ok": True, "reason": None},
    }
    assert parsed["consumers_selected"] == ["dynamo-1.6", "dynamo-1.7"]
    assert all(set(node["consumers"]) == {"dynamo-1.6", "dynamo-1.7"} for node in parsed["nodes"])
