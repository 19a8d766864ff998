"""What ``make test``'s SGLang pool runs, session by session, and what it leaves to ``make
test-rest``: together the two run every scenario file on every side they ran on before.

Standard library only. A side is a release with the plugin, or the rebuilt wheel of
``patches/`` without it. Each side's session runs only what can differ there:

- 0.5.23 with the plugin runs every file, in two sessions (the nodes' files with the relaunch;
  the seeds' deployments), so that the pool's two slots pack and finish together.
- 0.5.21 is the other adapter generation (``adapters/v0_5_19.py``): it runs the files whose
  subject is one of that adapter's own paths (the comment above its part names them). The
  sidecar supervisor and the gates are the same modules on both generations; they, and the
  deployments through Dynamo (which read the contract the files assert), run there in ``make
  test-rest``.
- The rebuilt wheel runs the files that cover the series' changes on their launch paths (the
  comment above its part). The rest runs there in ``make test-rest``; deployments 1 and 3 also
  at the seed's full shapes in ``make validate``'s rebuilt column, and the series' own unit
  tests (``series-tests``) stay in ``make test``.

``budget`` is each session's seconds in the pool on the 2-core machine: a session over twice
its budget fails the run, named (``sessions.finished``).
"""

from __future__ import annotations

import dataclasses

from envs import RELEASES

# The releases make test runs the tier on (the package's releases.py): the newest, and the
# newest of the older adapter generation.
NEWEST = RELEASES.NEWEST_RELEASE
(OLDER_GENERATION,) = (release for release in RELEASES.CI_RELEASES if release != NEWEST)

UNIT = "unit"
GATING = "entrypoints/test_follower_gating.py"
METADATA = "entrypoints/test_follower_metadata.py"
HTTP = "entrypoints/test_http_server_info.py"
SIDECAR_LAUNCH = "sidecar/test_sidecar_launch.py"
RESTART = "sidecar/test_restart_policy.py"
SWITCH_OFF = "sidecar/test_dynamo_switch_off.py"
SECURITY = "security"
FAULTS = "faults"
CONTRACT_V3 = "contract/test_dynamo_accepts_contract_v3.py"
RELAUNCH = "contract/test_relaunch_incarnation.py"
DEPLOYMENT_1 = "contract/test_ordinary_dp_aggregate.py"
DEPLOYMENT_2 = "contract/test_two_node_group.py"
DEPLOYMENT_3 = "disaggregation/test_ordinary_dp_bootstrap_rank.py"
DEPLOYMENT_4 = "disaggregation/test_attention_dp_disaggregate.py"

# Every path the tier holds (test-registered/pytest.ini's testpaths, by file where a side
# splits a directory); tests/scripts/test_pool_plan.py checks it against the tree.
ALL_PATHS = (
    UNIT, GATING, METADATA, HTTP, SIDECAR_LAUNCH, RESTART, SWITCH_OFF, SECURITY, FAULTS,
    CONTRACT_V3, RELAUNCH, DEPLOYMENT_1, DEPLOYMENT_2, DEPLOYMENT_3, DEPLOYMENT_4,
)  # fmt: skip
DEPLOYMENTS = (DEPLOYMENT_1, DEPLOYMENT_2, DEPLOYMENT_3, DEPLOYMENT_4)
# The rebuilt wheel never runs unit/, the plugin's own files.
REBUILT_PATHS = tuple(path for path in ALL_PATHS if path != UNIT)


@dataclasses.dataclass(frozen=True)
class Part:
    """One pytest session: ``paths`` of test-registered/ on one side."""

    label: str
    release: str
    rebuilt: bool
    paths: tuple[str, ...]
    budget: float


# In the order the pool starts them: the two long ones first, then the rebuilt wheel's in the
# slot that frees first (the smoke pass follows it there), then 0.5.21's.
CI = (
    Part(
        f"{NEWEST}: nodes and relaunch",
        NEWEST,
        False,
        (
            UNIT,
            GATING,
            METADATA,
            HTTP,
            SIDECAR_LAUNCH,
            RESTART,
            SWITCH_OFF,
            SECURITY,
            FAULTS,
            CONTRACT_V3,
            RELAUNCH,
        ),
        1100,
    ),
    Part(f"{NEWEST}: deployments", NEWEST, False, DEPLOYMENTS, 1050),
    # The series' changes on their launch paths: the DP controller's sources and the HTTP body
    # (HTTP), the supervisor and the stop order (SIDECAR_LAUNCH, RESTART), the follower's
    # server and sidecar and its failed scheduler (RELAUNCH, DEPLOYMENT_2), the redaction.
    Part(
        f"{NEWEST} (rebuilt wheel)",
        NEWEST,
        True,
        (HTTP, SIDECAR_LAUNCH, RESTART, RELAUNCH, SECURITY, DEPLOYMENT_2),
        550,
    ),
    # The v0_5_19 adapter's own paths: the DP controller's side channel and the HTTP route
    # (HTTP), the publisher read-back and the follower's bind failure (METADATA), the follower
    # server's start, stop and failed scheduler (RELAUNCH, FAULTS), the reply's redaction.
    Part(
        OLDER_GENERATION,
        OLDER_GENERATION,
        False,
        (UNIT, HTTP, METADATA, RELAUNCH, SECURITY, FAULTS),
        600,
    ),
)

# What CI leaves out, so that CI and REST together run every path of every side once.
REST = (
    Part(f"{OLDER_GENERATION}: the rest", OLDER_GENERATION, False,
         (GATING, SIDECAR_LAUNCH, RESTART, SWITCH_OFF, CONTRACT_V3, *DEPLOYMENTS), 1000),
    # Deployment 4 skips itself on the rebuilt wheel: newest release with the plugin only.
    Part(f"{NEWEST} (rebuilt wheel): the rest", NEWEST, True,
         (GATING, METADATA, SWITCH_OFF, FAULTS, CONTRACT_V3, DEPLOYMENT_1, DEPLOYMENT_3,
          DEPLOYMENT_4), 900),
)  # fmt: skip

PLANS = {"ci": CI, "rest": REST}


def side_paths(parts: tuple[Part, ...]) -> dict[tuple[str, bool], list[str]]:
    """Each side's paths over the parts, in order, repeats kept (a repeat is a bug)."""
    sides: dict[tuple[str, bool], list[str]] = {}
    for part in parts:
        sides.setdefault((part.release, part.rebuilt), []).extend(part.paths)
    return sides
