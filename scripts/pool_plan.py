"""What ``make test``'s SGLang pool runs, session by session, and what it leaves to ``make
test-rest``: together the two run every scenario file on every side they ran on before.

Standard library only. A side is a release with the plugin, or the rebuilt wheel of
``patches/`` without it. Each side's session runs only what can differ there:

- 0.5.23 with the plugin runs every file, in two sessions (the seeds' deployments, and the
  rest), so that the pool's two slots pack and finish together.
- 0.5.21 (the older adapter generation, ``adapters/v0_5_19.py``) runs every file whose subject
  is one of its hooks: the node entrypoints, the sidecar, faults, secrets and relaunches. The
  deployments measured through Dynamo (1, 2 and 3) read the contract those files assert, and
  run there in ``make test-rest``.
- The rebuilt wheel runs the scenarios that exercise the series. Deployments 1 and 3 through
  Dynamo run there in ``make test-rest``, and at the seed's full shapes in ``make validate``'s
  rebuilt column; the contract-3 acceptance test launches no SGLang (the plugin's own server),
  so it runs with the plugin only.

``budget`` is each session's seconds in the pool on the 2-core machine: a session over twice
its budget fails the run, named (``sessions.finished``).
"""

from __future__ import annotations

import dataclasses

NEWEST = "0.5.23"
OLDER_GENERATION = "0.5.21"

UNIT = "unit"
ENTRYPOINTS = "entrypoints"
SIDECAR = "sidecar"
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
    UNIT, ENTRYPOINTS, SIDECAR, SECURITY, FAULTS, CONTRACT_V3, RELAUNCH,
    DEPLOYMENT_1, DEPLOYMENT_2, DEPLOYMENT_3, DEPLOYMENT_4,
)  # fmt: skip
NODES = (UNIT, ENTRYPOINTS, SIDECAR, SECURITY, FAULTS, CONTRACT_V3, RELAUNCH)
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


CI = (
    Part(f"{NEWEST}: deployments", NEWEST, False, DEPLOYMENTS, 1000),
    Part(f"{NEWEST}: nodes", NEWEST, False, NODES, 900),
    Part(
        OLDER_GENERATION,
        OLDER_GENERATION,
        False,
        (UNIT, ENTRYPOINTS, SIDECAR, SECURITY, FAULTS, RELAUNCH),
        800,
    ),
    Part(
        f"{NEWEST} (rebuilt wheel)",
        NEWEST,
        True,
        (ENTRYPOINTS, SIDECAR, SECURITY, FAULTS, RELAUNCH, DEPLOYMENT_2),
        700,
    ),
)

# What CI leaves out, so that CI and REST together run every path of every side once.
REST = (
    Part(
        f"{OLDER_GENERATION}: deployments",
        OLDER_GENERATION,
        False,
        (CONTRACT_V3, DEPLOYMENT_1, DEPLOYMENT_2, DEPLOYMENT_3, DEPLOYMENT_4),
        900,
    ),
    Part(
        f"{NEWEST} (rebuilt wheel): deployments 1 and 3",
        NEWEST,
        True,
        # Deployment 4 skips itself here: the newest release's session with the plugin only.
        (CONTRACT_V3, DEPLOYMENT_1, DEPLOYMENT_3, DEPLOYMENT_4),
        700,
    ),
)

PLANS = {"ci": CI, "rest": REST}


def side_paths(parts: tuple[Part, ...]) -> dict[tuple[str, bool], list[str]]:
    """Each side's paths over the parts, in order, repeats kept (a repeat is a bug)."""
    sides: dict[tuple[str, bool], list[str]] = {}
    for part in parts:
        sides.setdefault((part.release, part.rebuilt), []).extend(part.paths)
    return sides
