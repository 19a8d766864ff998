"""The hook groups each launch needs (``adapters/_plan.py``): one rule for both adapter
generations, which differ only where upstream does (before 0.5.22 the schedulers hand their
sources back to the engine themselves)."""

from __future__ import annotations

import pytest
from sglang_sidecar_overlay.adapters._plan import (
    GENERATION_0_5_19,
    GENERATION_0_5_22,
    LaunchPlan,
    launch_plan,
)

GENERATIONS = (GENERATION_0_5_19, GENERATION_0_5_22)


def plan(generation: str, **facts: bool) -> LaunchPlan:
    role = {"follower": False, "native_grpc": True, "sidecar": False, "prefill": False}
    return launch_plan(generation, **{**role, **facts})


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_leader_installs_grpc_and_its_sidecar_as_asked(generation: str) -> None:
    assert plan(generation).launch == ("leader_grpc",)
    assert plan(generation, sidecar=True).launch == ("leader_grpc", "leader_sidecar")
    assert plan(generation, native_grpc=False, sidecar=True).launch == ("leader_sidecar",)
    assert plan(generation, native_grpc=False).launch == ()


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_follower_serves_only_with_native_grpc_and_never_hooks_the_leader_sidecar(
    generation: str,
) -> None:
    assert plan(generation, follower=True, sidecar=True).launch == ("follower",)
    assert plan(generation, follower=True, native_grpc=False, sidecar=True).launch == ()


def test_only_releases_before_0_5_22_collect_sources_through_the_side_channel() -> None:
    old, new = plan(GENERATION_0_5_19), plan(GENERATION_0_5_22)
    assert old.children == ("sources",) and old.side_channel
    assert new.children == () and not new.side_channel
    assert plan(GENERATION_0_5_19, native_grpc=False).children == ()


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_prefill_node_hooks_its_senders(generation: str) -> None:
    children = plan(generation, prefill=True, follower=True).children
    assert children[-1] == "prefill_sender"
    assert "prefill_sender" not in plan(generation, follower=True).children


def test_an_unknown_generation_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"'0\.6\.0'"):
        launch_plan("0.6.0", follower=False, native_grpc=True, sidecar=False, prefill=False)
