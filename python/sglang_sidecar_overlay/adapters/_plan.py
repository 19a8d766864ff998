"""Which hook groups a node's launch needs: one pure rule for every supported release.

The adapters differ in what a group's hooks are, not in which groups a role needs, so the
choice is made here once from plain facts about the launch, and each adapter maps the names
to its own hooks:

- ``launch``: installed in the engine process as the launch starts. ``leader_grpc`` (the
  leader's ``GetServerInfo``) and ``leader_sidecar`` (``--sidecar`` under the supervisor) on a
  leader; ``follower`` (the follower's own metadata server) on a native-gRPC follower.
- ``children``: exported to the schedulers (and DP controller) the launch spawns.
  ``sources`` (publisher read-back and the side channel, before 0.5.22 only: later releases
  advertise the sources themselves) and ``prefill_sender`` (the bootstrap DP rank) on a
  prefill node.
"""

from __future__ import annotations

from sglang_sidecar_overlay.adapters._node_launch import LaunchPlan

# The two API generations (``releases.ADAPTERS``): before 0.5.22 the DP controller runs no
# plugins and upstream advertises no sources.
GENERATION_0_5_19 = "0.5.19"
GENERATION_0_5_22 = "0.5.22"


def launch_plan(
    generation: str, *, follower: bool, native_grpc: bool, sidecar: bool, prefill: bool
) -> LaunchPlan:
    """The hook groups a launch of this role needs on this release generation."""
    if generation not in (GENERATION_0_5_19, GENERATION_0_5_22):
        raise ValueError(f"unknown adapter generation {generation!r}")
    launch: tuple[str, ...]
    if follower:
        launch = ("follower",) if native_grpc else ()
    else:
        grpc: tuple[str, ...] = ("leader_grpc",) if native_grpc else ()
        launch = (*grpc, "leader_sidecar") if sidecar else grpc
    own_sources = generation == GENERATION_0_5_19 and native_grpc
    sources: tuple[str, ...] = ("sources",) if own_sources else ()
    children = (*sources, "prefill_sender") if prefill else sources
    return LaunchPlan(launch, children)
