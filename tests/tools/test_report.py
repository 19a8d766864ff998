"""The operator tools' one report type: every command's report derives its exit code from its
verdict the same way, and the CLI builds each command from its declared options.

Reports here are built from their data (what a probe, a group, a watch, a status or a selftest
found); the commands that make them from real servers are tested in ``test_cli.py`` and
``probe/``.
"""

from __future__ import annotations

import io

import pytest
from sglang_sidecar_overlay.tools import cli
from sglang_sidecar_overlay.tools.exit_codes import EXIT_OK, EXIT_PROBLEM, EXIT_UNREACHABLE
from sglang_sidecar_overlay.tools.probe.group import GroupReport
from sglang_sidecar_overlay.tools.probe.report import (
    ERROR,
    WARNING,
    Finding,
    FindingsReport,
    ProbeError,
    ProbeReport,
)
from sglang_sidecar_overlay.tools.probe.watch import WatchReport
from sglang_sidecar_overlay.tools.report import Report
from sglang_sidecar_overlay.tools.selftest import Check, SelftestReport
from sglang_sidecar_overlay.tools.status import StatusReport, collect_status


def down(target: str) -> ProbeReport:
    return ProbeReport(target, error=ProbeError("unreachable", f"cannot connect to {target}"))


def answered(target: str, *findings: Finding, strict: bool = False) -> ProbeReport:
    return ProbeReport(target, strict=strict, server_info={}, findings=list(findings))


WARNED = Finding(WARNING, "health", "health", "absent")
FAILED = Finding(ERROR, "shape", "node_rank", "not < nnodes")


@pytest.mark.parametrize(
    ("report", "code"),
    [
        (answered("a:1"), EXIT_OK),
        (answered("a:1", WARNED), EXIT_OK),
        (answered("a:1", WARNED, strict=True), EXIT_PROBLEM),
        (answered("a:1", FAILED), EXIT_PROBLEM),
        (down("a:1"), EXIT_UNREACHABLE),
        (GroupReport(["a:1", "b:2"], nodes=[answered("a:1"), answered("b:2")]), EXIT_OK),
        (GroupReport(["a:1", "b:2"], nodes=[answered("a:1"), down("b:2")]), EXIT_PROBLEM),
        (GroupReport(["a:1", "b:2"], nodes=[down("a:1"), down("b:2")]), EXIT_UNREACHABLE),
        (GroupReport(["a:1"], nodes=[answered("a:1")], findings=[FAILED]), EXIT_PROBLEM),
        (WatchReport(["a:1"], 1.0, []), EXIT_OK),
        (SelftestReport([Check("native module", True, "")]), EXIT_OK),
        (SelftestReport([Check("native module", False, "no")]), EXIT_PROBLEM),
        (SelftestReport([]), EXIT_PROBLEM),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Report) else str(value),
)
def test_the_exit_code_follows_from_the_verdict(report: Report, code: int) -> None:
    assert report.exit_code() == code
    as_json = report.to_json()
    assert as_json["ok"] is report.ok


def test_status_report_exit_code_follows_active() -> None:
    status = collect_status({"SGLANG_PLUGINS": "some_other_plugin"})
    report = StatusReport(status)
    assert status["active"] is False and report.exit_code() == EXIT_PROBLEM
    assert report.to_json() is status
    out = io.StringIO()
    report.render(out)
    assert "inactive: SGLANG_PLUGINS='some_other_plugin' does not list sidecar_overlay" in (
        out.getvalue()
    )


def test_a_node_and_a_group_share_the_findings_keys_in_one_order() -> None:
    node = answered("a:1", WARNED, FAILED)
    group = GroupReport(["a:1"], nodes=[node], findings=[FAILED])
    shared = ["checks", "errors", "warnings", "consumers", "consumers_selected"]
    for report in (node, group):
        assert isinstance(report, FindingsReport)
        keys = list(report.to_json())
        start = keys.index("checks")
        assert keys[start : start + len(shared)] == shared
    assert node.to_json()["errors"] == 1 and node.to_json()["warnings"] == 1
    assert group.to_json()["errors"] == 1 and group.to_json()["warnings"] == 0


def test_every_declared_command_is_parsed_with_its_options_and_json() -> None:
    parser = cli.build_parser()
    for command in cli.COMMANDS:
        args = parser.parse_args([command.name, "--json"])
        assert args.run is command.run and args.json is True
        for flags, options in command.options:
            dest = options.get("dest", flags[-1].lstrip("-").replace("-", "_"))
            assert hasattr(args, dest), (command.name, dest)


def test_options_that_do_not_go_together_are_a_usage_error(capsys) -> None:
    assert cli.main(["probe", "127.0.0.1:1", "--watch", "1", "--listen", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == "probe: --watch cannot be combined with --listen or --consumer"
