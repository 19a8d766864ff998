"""What a process spawned by the engine gets from its launch, through the one variable of
``adapters/_hooks.py``: its hook groups and the side channel.

Real spawned processes read what the engine process exported when it started them, the way
SGLang's schedulers and detokenizer inherit the environment at spawn.
"""

from __future__ import annotations

import multiprocessing
import os

import pytest
from sglang_sidecar_overlay.adapters import _hooks

ALL = ("sources", "prefill_sender")


def _child_groups(out) -> None:
    out.send(_hooks.child_groups(ALL))
    out.close()


def _child_sources_dir(out) -> None:
    out.send((_hooks.from_parent_launch() or {}).get("sources_dir"))
    out.close()


def _spawned_groups(report=_child_groups) -> list[str]:
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=report, args=(sender,))
    proc.start()
    try:
        assert receiver.poll(60), "the spawned process did not report"
        return receiver.recv()
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()


@pytest.fixture(autouse=True)
def _restore_env(monkeypatch):
    monkeypatch.delenv(_hooks.CHILD_LAUNCH_ENV, raising=False)


def test_a_process_no_launch_spawned_registers_every_child_group() -> None:
    assert _spawned_groups() == list(ALL)


def test_children_of_a_launch_get_its_groups_and_later_ones_none() -> None:
    with _hooks.exported_to_children(["prefill_sender"]):
        assert _spawned_groups() == ["prefill_sender"]
    # What the engine spawns after the launch (the detokenizer) registers nothing.
    assert os.environ[_hooks.CHILD_LAUNCH_ENV] == ""
    assert _spawned_groups() == []


def test_a_launch_that_needs_nothing_in_its_children_exports_nothing() -> None:
    with _hooks.exported_to_children([]):
        assert _spawned_groups() == []


def test_the_side_channel_goes_to_the_children_with_their_groups(tmp_path) -> None:
    with _hooks.exported_to_children(["sources"], str(tmp_path)):
        assert _spawned_groups(_child_sources_dir) == str(tmp_path)
        assert _spawned_groups() == ["sources"]
    assert _spawned_groups(_child_sources_dir) is None
