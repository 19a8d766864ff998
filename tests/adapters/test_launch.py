"""What a node's launch hook decides before any scheduler starts (``adapters/_launch``).

The ``--sidecar-args`` options and the ``dp_size`` switch: a bad value fails the launch there,
naming the option and the value, before the launch begins. A good launch parses the options
once and every sidecar of the launch uses them. The SGLang tier runs the same through a real
leader (``faults/test_launch_faults.py``).

Nothing begins a launch but the launch hook (or an explicit ``begin_node_launch``): a hook SGLang
calls in a process where no launch began raises, naming the hook and the cause.
"""

from __future__ import annotations

import json
import types

import pytest
from sglang_sidecar_overlay.adapters import _launch
from sglang_sidecar_overlay.adapters._node_launch import PROCESS, NoLaunchError, current_launch
from sglang_sidecar_overlay.contract.legacy_dp_size import LEGACY_DP_SIZE_ENV
from sglang_sidecar_overlay.sidecar import supervisor


def launch_args(sidecar: str | None, sidecar_args: object) -> types.SimpleNamespace:
    return types.SimpleNamespace(sidecar=sidecar, sidecar_args=sidecar_args)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (["--sidecar-restart", "sometimes"], "--sidecar-restart must be one of never, on-failure"),
        (["--sidecar-max-restarts=-1"], "--sidecar-max-restarts must be >= 0, got -1"),
        (["--sidecar-restart-window", "soon"], "--sidecar-restart-window: invalid value 'soon'"),
    ],
)
def test_a_bad_sidecar_option_fails_before_the_launch_begins(bad: list[str], message: str) -> None:
    before = _launch.begin_node_launch()
    # SGLang holds --sidecar-args as JSON text.
    with pytest.raises(ValueError, match=message):
        _launch.begin_node_launch(launch_args("provider", json.dumps(bad)))
    assert current_launch("a test") is before


def test_a_bad_switch_value_fails_before_the_launch_begins(monkeypatch) -> None:
    before = _launch.begin_node_launch()
    monkeypatch.setenv(LEGACY_DP_SIZE_ENV, "maybe")
    with pytest.raises(ValueError, match="'maybe' is not a boolean"):
        _launch.begin_node_launch(launch_args("dynamo.sglang.sidecar", []))
    assert current_launch("a test") is before


def test_good_options_begin_a_new_launch_with_them() -> None:
    before = _launch.begin_node_launch()
    args = ["--sidecar-restart", "on-failure", "--provider-flag", "x"]
    launch = _launch.begin_node_launch(launch_args("provider", args))
    assert current_launch("a test") is launch is not before
    assert launch.incarnation.id != before.incarnation.id
    assert launch.sidecar_options is not None and launch.sidecar_options.restart == "on-failure"
    assert launch.provider_args == ["--provider-flag", "x"]


def test_sidecar_args_without_a_sidecar_are_not_read() -> None:
    # Without --sidecar nothing uses them, as in upstream's launch.
    before = _launch.begin_node_launch()
    launch = _launch.begin_node_launch(launch_args(None, ["--sidecar-restart", "sometimes"]))
    assert launch is not before and launch.sidecar_options is None


def test_the_switch_is_decided_once_per_launch(monkeypatch) -> None:
    monkeypatch.delenv(LEGACY_DP_SIZE_ENV, raising=False)
    launch = _launch.begin_node_launch(launch_args("dynamo.sglang.sidecar", []))
    assert launch.legacy_dp_size is True
    # A later change of the environment is not re-read by this launch's replies.
    monkeypatch.setenv(LEGACY_DP_SIZE_ENV, "0")
    assert current_launch("a test") is launch and launch.legacy_dp_size is True


def test_the_sidecar_options_are_parsed_once_per_launch(monkeypatch) -> None:
    from sglang_sidecar_overlay.adapters import _sidecar

    parses: list[list[str]] = []
    parse = supervisor.SidecarOptions.from_args.__func__

    def counted(cls, sidecar_args):
        parses.append(list(sidecar_args))
        return parse(cls, sidecar_args)

    monkeypatch.setattr(supervisor.SidecarOptions, "from_args", classmethod(counted))
    args = ["--sidecar-on-followers", "--sidecar-shutdown-timeout", "3", "--flag"]
    launch = _launch.begin_node_launch(launch_args("provider", args), follower=True)
    # The follower's sidecar and a leader's, as the node would build them: no new parse.
    follower = _sidecar._node_sidecar(launch, "127.0.0.1", 5000, "follower")
    leader = _sidecar._node_sidecar(launch, "127.0.0.1", 5001, "leader")
    assert len(parses) == 1
    for sidecar in (follower, leader):
        assert sidecar.supervisor.provider_args == ["--flag"]
        assert sidecar.supervisor.options.shutdown_timeout == 3.0
        assert sidecar.running is launch.sidecars


def test_a_prefill_launch_exports_the_sender_hook_to_its_schedulers() -> None:
    prefill = types.SimpleNamespace(sidecar=None, sidecar_args=None, disaggregation_mode="prefill")
    decode = types.SimpleNamespace(sidecar=None, sidecar_args=None, disaggregation_mode="decode")
    assert "prefill_sender" in _launch.begin_node_launch(prefill).plan.children
    assert "prefill_sender" not in _launch.begin_node_launch(decode).plan.children


@pytest.fixture
def no_launch(monkeypatch):
    """A process where no launch began (an engine built outside SGLang's launch path)."""
    monkeypatch.setattr(PROCESS, "launch", None)


@pytest.mark.parametrize("adapter", ["v0_5_19", "v0_5_22"])
def test_the_server_info_route_with_no_launch_raises_naming_the_cause(no_launch, adapter) -> None:
    import importlib

    module = importlib.import_module(f"sglang_sidecar_overlay.adapters.{adapter}")
    cause = r"/server_info needs this node's launch, but no launch began"
    with pytest.raises(NoLaunchError, match=cause):
        module.server_info_body({"status": "ready", "kv_event_sources": []})
    assert_no_launch_began()


def test_the_sigterm_hook_with_no_launch_raises_naming_the_cause(no_launch) -> None:
    from sglang_sidecar_overlay.adapters import _sidecar

    cause = r"SIGTERM handler.s sidecar stop needs .*Engine\._launch_scheduler_processes, which"
    with pytest.raises(NoLaunchError, match=cause):
        _sidecar.after_sigterm_handler(None, object())
    assert_no_launch_began()


def assert_no_launch_began() -> None:
    # Nothing began a launch on the way.
    with pytest.raises(NoLaunchError):
        current_launch("a test")


def test_an_explicit_begin_is_what_the_hooks_then_find(no_launch) -> None:
    # The documented call for an engine built outside SGLang's launch path.
    launch = _launch.begin_node_launch(launch_args(None, None))
    assert current_launch("a test") is launch
