"""``scripts/pool_plan.py``: ``make test``'s plan and ``make test-rest`` together run every
scenario file on every side once, and the plan's paths are the tier's."""

from __future__ import annotations

import configparser
from pathlib import Path

import pool_plan
import pytest

REGISTERED = Path(__file__).resolve().parents[2] / "test-registered"
NEWEST = (pool_plan.NEWEST, False)
OLDER = (pool_plan.OLDER_GENERATION, False)
REBUILT = (pool_plan.NEWEST, True)


def registered_files() -> set[str]:
    return {str(path.relative_to(REGISTERED)) for path in REGISTERED.rglob("test_*.py")}


def covered(paths: list[str]) -> set[str]:
    return {name for name in registered_files() for path in paths if name.startswith(path)}


def test_every_path_exists_and_every_test_file_is_under_one() -> None:
    for path in pool_plan.ALL_PATHS:
        assert (REGISTERED / path).exists(), path
    assert covered(list(pool_plan.ALL_PATHS)) == registered_files()


def test_the_tiers_testpaths_are_the_plans_directories() -> None:
    ini = configparser.ConfigParser()
    ini.read(REGISTERED / "pytest.ini")
    testpaths = set(ini["pytest"]["testpaths"].split())
    assert {path.split("/")[0] for path in pool_plan.ALL_PATHS} == testpaths


@pytest.mark.parametrize(
    ("side", "expected"),
    [
        (NEWEST, pool_plan.ALL_PATHS),
        (OLDER, pool_plan.ALL_PATHS),
        (REBUILT, pool_plan.REBUILT_PATHS),
    ],
)
def test_ci_and_rest_run_each_sides_files_once(side: tuple[str, bool], expected: tuple) -> None:
    paths = [
        path
        for plan in (pool_plan.CI, pool_plan.REST)
        for path in pool_plan.side_paths(plan).get(side, [])
    ]
    assert sorted(paths) == sorted(expected)


def test_the_newest_release_with_the_plugin_runs_everything_in_make_test() -> None:
    assert sorted(pool_plan.side_paths(pool_plan.CI)[NEWEST]) == sorted(pool_plan.ALL_PATHS)


def test_every_session_has_a_budget_and_its_own_label() -> None:
    for plan in pool_plan.PLANS.values():
        assert all(part.budget > 0 for part in plan)
        assert len({part.label for part in plan}) == len(plan)
