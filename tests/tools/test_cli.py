"""The CLI as operators run it: a subprocess against real gRPC servers and ZMQ publishers.

Nodes are small grpcio servers (``test_probe.grpc_node``) serving crafted snapshots built
by the core builder from real, bound publishers; ``selftest`` uses the native server.
``status`` sees fake ``*.dist-info`` directories put first on the subprocess's path, which
is how importlib.metadata would see a real SGLang or overlay install.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from probe_nodes import (
    closed_port,
    feeding,
    good_info,
    grpc_node,
    live_publishers,
    publish_history,
    run_cli,
)
from sglang_sidecar_overlay.contract.server_info import LEGACY_DP_SIZE_ENV, render_server_info
from sglang_sidecar_overlay.releases import SUPPORTED_RANGE, installed_sglang_version
from sglang_sidecar_overlay.tools.probe import wire

SERVING = wire.ServingStatus.SERVING


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def native_available() -> bool:
    probe_import = run_cli("status", "--json")
    return json.loads(probe_import.stdout)["native"]["importable"]


# --- help ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], ["status"], ["probe"], ["selftest"]])
def test_every_command_has_help(command: list[str]) -> None:
    result = run_cli(*command, "--help")
    assert result.returncode == 0
    assert "usage: sglang-sidecar-overlay" in result.stdout


def test_usage_error_exits_2_without_traceback() -> None:
    result = run_cli("probe", "127.0.0.1:1", "--timeout", "-3")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


# --- probe: a good node -------------------------------------------------------------------------


def test_probe_passes_against_a_live_node() -> None:
    with live_publishers() as publishers:
        publish_history(publishers, [7])
        text = render_server_info(good_info(publishers))
        with grpc_node(text, health=SERVING) as target, feeding(publishers):
            as_json = run_cli("probe", target, "--listen", "1", "--json")
            human = run_cli("probe", target, "--timeout", "5")
    assert as_json.returncode == 0, as_json.stdout
    report = json.loads(as_json.stdout)
    assert report["ok"] is True and report["errors"] == 0 and report["warnings"] == 0
    assert report["health"]["status"] == "SERVING"
    assert report["server_info"]["kv_event_rank_space"]["local_ranks"] == [2, 3]
    ranks = report["listen"]["ranks"]
    assert [rank["dp_rank"] for rank in ranks] == [2, 3]
    for rank in ranks:
        assert rank["batches"] > 0 and rank["replay"] == "complete"
        assert rank["replay_batches"] >= 1 and rank["rank_matches"] is True
        assert rank["highest_seq"] >= rank["replay_batches"] - 1
    assert human.returncode == 0
    assert human.stdout.splitlines()[-1].startswith("PASS (0 errors, 0 warnings)")
    assert "✓ health" in human.stdout


# --- probe: broken nodes, one per contract rule -------------------------------------------------


def _mutate(info: dict, rule: str) -> str:
    if rule == "unparsable JSON":
        return '{"node_rank": 1,'
    if rule == "node_rank >= nnodes":
        info["node_rank"] = 2
    elif rule == "multi-node without dist_init_addr":
        info["dist_init_addr"] = None
    elif rule == "block size differs from kv_events":
        info["kv_events"]["block_size"] = 64
    elif rule == "no kv_event_sources":
        del info["kv_event_sources"]
    else:
        _break_sources(info, rule)
    return json.dumps(info)


def _break_sources(info: dict, rule: str) -> None:
    sources = info["kv_event_sources"]
    if rule == "rank outside the rank space":
        sources[1]["dp_rank"] = 4
        info["kv_event_rank_space"]["local_ranks"] = [2, 4]
    elif rule == "duplicate rank":
        sources[1]["dp_rank"] = 2
    elif rule == "duplicate endpoint":
        sources[1]["endpoint"] = sources[0]["endpoint"]
    elif rule == "wildcard endpoint":
        sources[1]["endpoint"] = sources[1]["endpoint"].replace("127.0.0.1", "0.0.0.0")
    elif rule == "connect-only endpoint":
        sources[1]["endpoint"] = f"tcp://127.0.0.1:{closed_port()}"
    elif rule == "inproc endpoint":
        sources[1]["endpoint"] = "inproc://kv"
    elif rule == "relative ipc path":
        sources[1]["endpoint"] = "ipc://run/kv.sock"
    elif rule == "non-positive block size":
        sources[0]["block_size"] = 0
    elif rule == "unequal block sizes":
        sources[1]["block_size"] = 32


BROKEN = [
    ("unparsable JSON", "json_info", "not parsable JSON"),
    ("node_rank >= nnodes", "node_rank", "not < nnodes"),
    ("multi-node without dist_init_addr", "dist_init_addr", "must be set"),
    ("rank outside the rank space", "kv_event_sources[1].dp_rank", "outside"),
    ("duplicate rank", "kv_event_sources[1].dp_rank", "also advertised"),
    ("duplicate endpoint", "kv_event_sources[1].endpoint", "also advertised"),
    ("wildcard endpoint", "kv_event_sources[1].endpoint", "wildcard"),
    ("connect-only endpoint", "kv_event_sources[1].endpoint", "nothing accepts connections"),
    ("inproc endpoint", "kv_event_sources[1].endpoint", "inproc"),
    ("relative ipc path", "kv_event_sources[1].endpoint", "absolute"),
    ("non-positive block size", "kv_event_sources[0].block_size", "≥ 1"),
    ("unequal block sizes", "kv_event_sources[1].block_size", "differs"),
    ("block size differs from kv_events", "kv_events.block_size", "differs"),
    ("no kv_event_sources", "kv_event_sources", "missing"),
]


@pytest.fixture(scope="module")
def publishers():
    with live_publishers() as pubs:
        yield pubs


@pytest.mark.parametrize(("rule", "field", "words"), BROKEN, ids=[case[0] for case in BROKEN])
def test_probe_fails_on_a_broken_node(publishers, rule: str, field: str, words: str) -> None:
    text = _mutate(copy.deepcopy(good_info(publishers)), rule)
    with grpc_node(text, health=SERVING) as target:
        as_json = run_cli("probe", target, "--json")
        human = run_cli("probe", target)
    assert as_json.returncode == 1, as_json.stdout
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and report["errors"] >= 1
    named = [c for c in report["checks"] if c["level"] == "error" and c["field"] == field]
    assert named and words in named[0]["message"], report["checks"]
    assert human.returncode == 1
    line = next(line for line in human.stdout.splitlines() if f" {field} " in line)
    assert "✗" in line and words in line
    assert human.stdout.splitlines()[-1].startswith("FAIL")


def test_probe_fails_when_batches_carry_another_rank() -> None:
    with live_publishers(stamp_rank=5) as pubs:
        text = render_server_info(good_info(pubs))
        with grpc_node(text, health=SERVING) as target, feeding(pubs):
            result = run_cli("probe", target, "--listen", "1", "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    rank3 = report["listen"]["ranks"][1]
    assert rank3["stamped_ranks"] == [5] and rank3["rank_matches"] is False
    assert any(
        c["field"] == "kv_event_sources[1].dp_rank" and "advertised 3" in c["message"]
        for c in report["checks"]
        if c["level"] == "error"
    )


def test_dp_size_pitfall_is_told_and_fails_only_for_a_consumer_that_rejects_it(
    publishers,
) -> None:
    info = good_info(publishers)
    info["dp_size"] = 1  # what SGLang 0.5.22+ reports for --dp 4 --enable-dp-attention
    with grpc_node(json.dumps(info), health=SERVING) as target:
        strict = run_cli("probe", target, "--strict")
        judged = run_cli("probe", target, "--consumer", "dynamo-1.6", "--json")
    assert strict.returncode == 0, strict.stdout
    told = next(line for line in strict.stdout.splitlines() if "outside dp_size 1" in line)
    assert told.split()[:2] == ["·", "consumers"]
    assert 'dynamo-1.6 rejects this node: "KV source rank 2 is outside dp_size 1"' in told
    assert judged.returncode == 1
    parsed = json.loads(judged.stdout)
    assert parsed["warnings"] == 0 and parsed["errors"] == 1
    assert parsed["consumers"]["dynamo-1.6"]["registers"] == 1
    assert parsed["consumers"]["dynamo-1.6"]["rank_space"] == 4
    (error,) = [c for c in parsed["checks"] if c["level"] == "error"]
    assert "set it to 1 on every node" in error["message"]


def test_not_serving_health_fails(publishers) -> None:
    text = render_server_info(good_info(publishers))
    with grpc_node(text, health=wire.ServingStatus.NOT_SERVING) as target:
        result = run_cli("probe", target)
    assert result.returncode == 1
    assert any("health" in line and "NOT_SERVING" in line for line in result.stdout.splitlines())


# --- probe: nodes that cannot be probed ---------------------------------------------------------


def test_closed_port_is_one_line() -> None:
    port = closed_port()
    result = run_cli("probe", f"127.0.0.1:{port}")
    assert result.returncode == 3 and result.stdout == ""
    line = one_line(result.stderr)
    assert f"127.0.0.1:{port}" in line and "cannot connect" in line
    as_json = run_cli("probe", f"127.0.0.1:{port}", "--json")
    assert as_json.returncode == 3
    assert json.loads(as_json.stdout)["error"]["kind"] == "unreachable"


def test_non_sglang_server_is_one_line() -> None:
    with grpc_node(sglang=False) as target:
        result = run_cli("probe", target)
    assert result.returncode == 3
    assert "not an SGLang native gRPC server" in one_line(result.stderr)


def test_timeout_is_one_line() -> None:
    with grpc_node("{}", hang=True) as target:
        result = run_cli("probe", target, "--timeout", "0.5")
    assert result.returncode == 3
    assert "no answer to GetServerInfo within 0.5s" in one_line(result.stderr)


def test_bad_address_is_one_line() -> None:
    result = run_cli("probe", "no-port-here")
    assert result.returncode == 3
    assert "expected HOST:PORT" in one_line(result.stderr)


# --- status -------------------------------------------------------------------------------------


def fake_dist(root: Path, name: str, version: str, entry_points: str | None = None) -> Path:
    dist = root / f"{name}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if entry_points is not None:
        (dist / "entry_points.txt").write_text(entry_points)
    return root


OVERLAY_ENTRY_POINTS = (
    "[sglang.srt.plugins]\nsidecar_overlay = sglang_sidecar_overlay.plugin:load\n"
)


def test_status_without_sglang() -> None:
    if installed_sglang_version() is not None:
        pytest.skip("SGLang is installed in this environment")
    result = run_cli("status", "--json")
    assert result.returncode == 1
    status = json.loads(result.stdout)
    assert status["active"] is False
    assert status["sglang"] == {
        "installed": False,
        "version": None,
        "supported": False,
        "supported_range": SUPPORTED_RANGE,
        "supported_versions": status["sglang"]["supported_versions"],
        "adapter": None,
        "adapter_present": False,
    }
    assert "SGLang is not installed in this Python environment" in status["reasons"]
    human = run_cli("status")
    assert human.returncode == 1
    assert "inactive: SGLang is not installed" in human.stdout


def test_status_with_an_unsupported_sglang(tmp_path: Path) -> None:
    site = fake_dist(tmp_path, "sglang", "0.5.18")
    result = run_cli("status", "--json", extra_path=(site,))
    assert result.returncode == 1
    status = json.loads(result.stdout)
    assert status["sglang"]["version"] == "0.5.18"
    assert status["sglang"]["supported"] is False and status["sglang"]["adapter"] is None
    assert any("0.5.18 is not supported" in reason for reason in status["reasons"])
    human = run_cli("status", extra_path=(site,))
    assert "NOT supported" in human.stdout and SUPPORTED_RANGE in human.stdout


def test_status_reports_entry_point_and_sglang_plugins(tmp_path: Path) -> None:
    site = fake_dist(tmp_path, "sglang", "0.5.22.post1")
    fake_dist(site, "sglang_sidecar_overlay", "0.1.0", OVERLAY_ENTRY_POINTS)
    allowed = run_cli(
        "status", "--json", extra_path=(site,), env={"SGLANG_PLUGINS": " other , sidecar_overlay"}
    )
    status = json.loads(allowed.stdout)
    assert status["sglang"]["supported"] is True
    assert status["sglang"]["adapter"] == "sglang_sidecar_overlay.adapters.v0_5_22"
    assert status["plugin"]["entry_point_visible"] is True
    assert status["plugin"]["entry_point"] == "sglang_sidecar_overlay.plugin:load"
    assert status["plugin"]["allowed"] is True
    assert not any("SGLANG_PLUGINS" in reason for reason in status["reasons"])

    excluded = run_cli("status", extra_path=(site,), env={"SGLANG_PLUGINS": "other_plugin"})
    assert excluded.returncode == 1
    assert "inactive: SGLANG_PLUGINS='other_plugin' does not list sidecar_overlay" in (
        excluded.stdout
    )


def test_status_shows_the_legacy_dp_size_switch() -> None:
    on = json.loads(run_cli("status", "--json", env={LEGACY_DP_SIZE_ENV: "1"}).stdout)
    assert on["legacy_dp_size"]["enabled"] is True
    assert "attn_dp_size = 1" in on["legacy_dp_size"]["shape"]
    unset = run_cli("status")
    # The default, with the consumer version it would be decided for on this machine.
    assert re.search(
        r"unset \(SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE\): on for --sidecar "
        r"dynamo\.sglang\.sidecar \(ai-dynamo-runtime (not installed|[0-9][^)]*)\)",
        unset.stdout,
    ), unset.stdout
    bad = run_cli("status", env={LEGACY_DP_SIZE_ENV: "maybe"})
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "is not a boolean" in bad.stdout


# --- selftest -----------------------------------------------------------------------------------


def test_selftest_passes() -> None:
    if not native_available():
        pytest.skip("the native module is not built into this environment")
    as_json = run_cli("selftest", "--json", timeout=120)
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["ok"] is True
    names = [check["name"] for check in report["checks"]]
    assert "events rank 2" in names and "events rank 3" in names and "shutdown" in names
    assert report["probe"]["ok"] is True
    human = run_cli("selftest", timeout=120)
    assert human.returncode == 0
    assert human.stdout.splitlines()[-1].startswith("PASS")


def test_probe_passes_against_the_native_server() -> None:
    if not native_available():
        pytest.skip("the native module is not built into this environment")
    from sglang_sidecar_overlay import _native

    with live_publishers() as pubs:
        text = render_server_info(good_info(pubs))
        with _native.start_metadata_server("127.0.0.1", 0, text) as server:
            target = f"127.0.0.1:{server.port}"
            server.set_serving(True)
            with feeding(pubs):
                serving = run_cli("probe", target, "--listen", "1", "--json")
            server.set_serving(False)
            not_serving = run_cli("probe", target)
    assert serving.returncode == 0, serving.stdout
    report = json.loads(serving.stdout)
    assert report["health"]["status"] == "SERVING"
    assert all(rank["rank_matches"] for rank in report["listen"]["ranks"])
    assert not_serving.returncode == 1


def test_console_script_when_installed() -> None:
    script = Path(sys.executable).parent / "sglang-sidecar-overlay"
    if not script.exists():
        pytest.skip("the wheel (and its console script) is not installed in this environment")
    result = subprocess.run(
        [str(script), "status", "--json"], capture_output=True, text=True, timeout=60, check=False
    )
    status = json.loads(result.stdout)
    assert status["plugin"]["name"] == "sidecar_overlay"
    # Exit 0 exactly when the status says active (1, with its reasons, otherwise).
    assert result.returncode == (0 if status["active"] else 1), status
    assert status["active"] or status["reasons"]
