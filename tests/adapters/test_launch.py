"""What a node's launch hook reads before any scheduler starts (``adapters/_launch``).

The ``--sidecar-args`` options and the ``dp_size`` switch: a bad value fails the launch there,
naming the option and the value, before the launch's incarnation begins. The SGLang tier runs
the same through a real leader (``faults/test_launch_faults.py``).
"""

from __future__ import annotations

import json
import types

import pytest
from sglang_sidecar_overlay.adapters import _launch
from sglang_sidecar_overlay.contract import incarnation


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
def test_a_bad_sidecar_option_fails_before_the_incarnation(bad: list[str], message: str) -> None:
    before = incarnation.begin_launch()
    # SGLang holds --sidecar-args as JSON text.
    with pytest.raises(ValueError, match=message):
        _launch.begin_node_launch(launch_args("provider", json.dumps(bad)))
    assert incarnation.launch_incarnation() is before


def test_good_options_begin_a_new_incarnation() -> None:
    before = incarnation.begin_launch()
    args = ["--sidecar-restart", "on-failure", "--provider-flag", "x"]
    _launch.begin_node_launch(launch_args("provider", args))
    assert incarnation.launch_incarnation() is not before


def test_sidecar_args_without_a_sidecar_are_not_read() -> None:
    # Without --sidecar nothing uses them, as in upstream's launch.
    before = incarnation.begin_launch()
    _launch.begin_node_launch(launch_args(None, ["--sidecar-restart", "sometimes"]))
    assert incarnation.launch_incarnation() is not before
