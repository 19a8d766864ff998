"""Unit tests of the sidecar supervisor's pure pieces and of the provider contract.

The pure pieces (endpoint, options, backoff, restart budget, exit descriptions) run in-process;
the provider contract runs real spawned sidecars from ``tests/sidecar_providers``.
"""

from __future__ import annotations

import os
import random
import signal

import pytest
from sglang_sidecar_overlay.sidecar.supervisor import (
    BACKOFF_CAP,
    BACKOFF_JITTER,
    RestartBudget,
    SidecarOptions,
    SidecarSupervisor,
    backoff_delay,
    build_sidecar_endpoint,
    describe_exit,
    sidecar_environment,
)
from sidecar_providers.harness import Supervisors, read_report, wait_for

# -- endpoint ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("", "http://127.0.0.1:30001"),
        ("0.0.0.0", "http://127.0.0.1:30001"),
        ("*", "http://127.0.0.1:30001"),
        ("::", "http://[::1]:30001"),
        ("[::]", "http://[::1]:30001"),
        ("::1", "http://[::1]:30001"),
        ("[::1]", "http://[::1]:30001"),
        ("fe80::2", "http://[fe80::2]:30001"),
        ("localhost", "http://localhost:30001"),
        ("10.1.2.3", "http://10.1.2.3:30001"),
    ],
)
def test_endpoint_rewrites_wildcards_and_brackets_ipv6(host: str, expected: str) -> None:
    assert build_sidecar_endpoint(host, 30001) == expected


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_endpoint_rejects_bad_port_naming_it(port: int) -> None:
    with pytest.raises(ValueError, match=str(port)):
        build_sidecar_endpoint("127.0.0.1", port)


# -- options ----------------------------------------------------------------------------------


def test_options_defaults_match_upstream() -> None:
    opts, rest = SidecarOptions.from_args([])
    assert opts == SidecarOptions()
    assert (opts.shutdown_timeout, opts.restart, opts.max_restarts) == (45.0, "never", 3)
    assert (opts.restart_window, opts.on_followers) == (300.0, False)
    assert rest == []


def test_options_are_pulled_out_and_provider_args_kept_in_order() -> None:
    opts, rest = SidecarOptions.from_args(
        [
            "--namespace",
            "dyn",
            "--sidecar-shutdown-timeout",
            "7.5",
            "-v",
            "--sidecar-restart=on-failure",
            "--sidecar-max-restarts",
            "5",
            "--sidecar-restart-window=60",
            "--sidecar-on-followers",
            "--x=1",
        ]
    )
    assert opts == SidecarOptions(7.5, "on-failure", 5, 60.0, on_followers=True)
    assert rest == ["--namespace", "dyn", "-v", "--x=1"]


def test_options_double_dash_ends_parsing() -> None:
    opts, rest = SidecarOptions.from_args(["a", "--", "--sidecar-restart", "on-failure"])
    assert opts.restart == "never"
    assert rest == ["a", "--", "--sidecar-restart", "on-failure"]


@pytest.mark.parametrize(
    "args",
    [
        ["--sidecar-shutdown-timeout", "0"],
        ["--sidecar-shutdown-timeout", "-1"],
        ["--sidecar-shutdown-timeout", "nan"],
        ["--sidecar-shutdown-timeout", "inf"],
        ["--sidecar-shutdown-timeout", "soon"],
        ["--sidecar-shutdown-timeout"],
        ["--sidecar-restart", "always"],
        ["--sidecar-max-restarts", "-1"],
        ["--sidecar-max-restarts", "2.5"],
        ["--sidecar-restart-window", "0"],
        ["--sidecar-on-followers=yes"],
    ],
)
def test_options_bad_values_raise_value_error(args: list[str]) -> None:
    with pytest.raises(ValueError, match="sidecar"):
        SidecarOptions.from_args(args)


# -- restart policy pieces --------------------------------------------------------------------


def test_backoff_doubles_from_one_second_and_caps_at_thirty_with_jitter() -> None:
    rng = random.Random(7)
    bases = [1, 2, 4, 8, 16, 30, 30, 30]
    for recent, base in enumerate(bases):
        for _ in range(50):
            delay = backoff_delay(recent, rng)
            assert base <= delay <= base * (1 + BACKOFF_JITTER)
    assert max(backoff_delay(40, rng) for _ in range(100)) <= BACKOFF_CAP * (1 + BACKOFF_JITTER)
    # Jitter really varies.
    assert len({backoff_delay(0, rng) for _ in range(10)}) > 1


def test_budget_gives_up_after_max_restarts_within_window() -> None:
    budget = RestartBudget(max_restarts=3, window=100.0)
    assert [budget.try_spend(t) for t in (0.0, 10.0, 20.0)] == [True, True, True]
    assert budget.try_spend(30.0) is False
    assert budget.recent(30.0) == 3


def test_budget_forgets_restarts_outside_window() -> None:
    budget = RestartBudget(max_restarts=2, window=100.0)
    assert budget.try_spend(0.0) and budget.try_spend(50.0)
    assert not budget.try_spend(99.0)
    # The restart at t=0 leaves the window at t=100: one slot frees, and backoff restarts low.
    assert budget.recent(100.0) == 1
    assert budget.try_spend(100.0)
    assert budget.recent(250.0) == 0
    assert budget.try_spend(250.0) and budget.try_spend(251.0)


def test_budget_zero_never_restarts() -> None:
    assert RestartBudget(0, 10.0).try_spend(0.0) is False


def test_describe_exit() -> None:
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert "unexpected" not in describe_exit(0, expected=True)
    assert describe_exit(0) == "exited cleanly (code 0) while the server was running"


def test_supervisor_rejects_bad_module_name() -> None:
    with pytest.raises(ValueError, match="not a dotted"):
        SidecarSupervisor("pkg..mod", "http://127.0.0.1:1", [], SidecarOptions(), print)


# -- provider contract (real spawned processes) -----------------------------------------------


@pytest.fixture
def supervise():
    """Build supervisors that are always stopped (and their trees killed) at teardown."""
    supervisors = Supervisors()
    yield supervisors.make
    supervisors.close()


def test_main_gets_exactly_provider_args_and_endpoint(supervise, tmp_path) -> None:
    report = str(tmp_path / "r.json")
    opts, provider_args = SidecarOptions.from_args(
        [
            *("--sidecar-shutdown-timeout", "5", "--report", report),
            *("--sidecar-restart=on-failure", "--name", "a b", "--sidecar-on-followers"),
        ]
    )
    assert provider_args == ["--report", report, "--name", "a b"]
    sup, fatal = supervise("serve", provider_args, options=opts)
    sup.start()
    got = read_report(report)
    assert got["argv"] == provider_args
    assert got["endpoint_env"] == "http://127.0.0.1:30001"
    assert fatal.calls == []


def test_dynamo_endpoint_variable_is_given_unless_the_operator_set_it(
    supervise, tmp_path, monkeypatch
) -> None:
    # NVIDIA Dynamo's released sidecar reads only DYN_SIDECAR_GRPC_ENDPOINT or --grpc-endpoint.
    monkeypatch.delenv("DYN_SIDECAR_GRPC_ENDPOINT", raising=False)
    report = str(tmp_path / "r.json")
    sup, _ = supervise("serve", ["--report", report])
    sup.start()
    got = read_report(report)
    assert got["dynamo_endpoint_env"] == got["endpoint_env"] == "http://127.0.0.1:30001"
    sup.stop()

    monkeypatch.setenv("DYN_SIDECAR_GRPC_ENDPOINT", "http://10.1.2.3:40000")
    operator_report = str(tmp_path / "operator.json")
    sup, _ = supervise("serve", ["--report", operator_report])
    sup.start()
    got = read_report(operator_report)
    assert got["dynamo_endpoint_env"] == "http://10.1.2.3:40000"
    assert got["endpoint_env"] == "http://127.0.0.1:30001"


def test_sidecar_environment_keeps_the_operators_dynamo_endpoint() -> None:
    env = sidecar_environment({"PATH": "/bin"}, "http://[::1]:5")
    assert env == {
        "PATH": "/bin",
        "SGLANG_GRPC_ENDPOINT": "http://[::1]:5",
        "DYN_SIDECAR_GRPC_ENDPOINT": "http://[::1]:5",
    }
    mine = {"DYN_SIDECAR_GRPC_ENDPOINT": "", "SGLANG_GRPC_ENDPOINT": "http://old:1"}
    assert sidecar_environment(mine, "http://127.0.0.1:7") == {
        "DYN_SIDECAR_GRPC_ENDPOINT": "",
        "SGLANG_GRPC_ENDPOINT": "http://127.0.0.1:7",
    }


def test_child_imports_nothing_heavy_before_main(supervise, tmp_path) -> None:
    report = str(tmp_path / "r.json")
    sup, _ = supervise("serve", ["--report", report])
    sup.start()
    # Only the package roots (logging at most) and the stdlib-only shim with its /proc
    # helpers: no SGLang, no torch, none of the overlay's heavier modules.
    assert read_report(report)["modules"] == [
        "sglang_sidecar_overlay",
        "sglang_sidecar_overlay.sidecar",
        "sglang_sidecar_overlay.sidecar.proctree",
        "sglang_sidecar_overlay.sidecar.shim",
    ]


def test_sidecar_leads_its_own_process_group(supervise, tmp_path) -> None:
    report = str(tmp_path / "r.json")
    sup, _ = supervise("serve", ["--report", report])
    sup.start()
    got = read_report(report)
    assert got["pgid"] == sup.pid == got["ppid"]
    assert os.getsid(sup.pid) == sup.pid
    assert got["pgid"] != os.getpgid(0)


@pytest.mark.parametrize(
    ("module", "code", "message"),
    [
        ("bad_import", 2, "cannot import provider module 'sidecar_providers.bad_import'"),
        ("no_main", 3, "provider module 'sidecar_providers.no_main' has no main(argv)"),
        (
            "main_not_callable",
            3,
            "provider module 'sidecar_providers.main_not_callable': main is not callable",
        ),
    ],
)
def test_contract_failures_exit_nonzero_naming_the_module(
    supervise, capfd, module: str, code: int, message: str
) -> None:
    sup, fatal = supervise(module, [])
    sup.start()
    assert fatal.event.wait(20)
    assert fatal.calls == [f"sidecar 'sidecar_providers.{module}' exited with code {code}"]
    err: list[str] = []

    def printed() -> bool:
        err.append(capfd.readouterr().err)  # each read consumes: keep what was seen
        return message in "".join(err)

    assert wait_for(printed, 5)
