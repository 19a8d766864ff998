"""Upstream's existing tests for the files the patch series touches, stock beside rebuilt.

``scripts/patches.py upstream-tests`` runs them: each listed file from a local copy of
upstream's ``test/`` (public in sgl-project/sglang, not in the wheel), unchanged on the
released wheel's env and, with the series' changes to those tests applied, on the rebuilt
wheel's env; then one verdict per file. Standard library only (plus ``git``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from cache import cache_root

# Upstream's existing tests for the files the series touches (public in sgl-project/sglang,
# not in the wheel), run by ``upstream-tests`` from a local copy of upstream's ``test/``.
UPSTREAM_TESTS = (
    "test/registered/unit/entrypoints/test_grpc_metadata.py",
    "test/registered/unit/server_args/test_server_args.py::TestGrpcServerArgs",
    "test/registered/unit/disaggregation/test_kv_events.py",
    "test/registered/unit/server_args/test_attn_dp_size.py",
    "test/registered/unit/plugins/test_hook_registry.py",
    "test/registered/unit/plugins/test_load_plugins.py",
)
# The series' changes to those files, which are not in the wheel and so not in the git-am
# series: unified diffs in upstream's paths, applied to the copy the rebuilt wheel runs.
UPSTREAM_TEST_CHANGES = "upstream-tests"


def log(message: str) -> None:
    print(f"[patches] {message}", file=sys.stderr, flush=True)


def _scratch_tests(tests_dir: Path, files: list[str], target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tests_dir / name, target / name)


def _apply_test_changes(
    changes_dir: Path, target: Path, files: list[str]
) -> tuple[list[str], set[str]]:
    """Apply the series' changes to upstream's tests present in ``target``.

    Returns the names of the changes applied and the files of those that do not apply to this
    copy (checked first with ``git apply --check``, so such a file stays as it was copied).
    """
    applied, not_comparable = [], set()
    for change in sorted(changes_dir.glob("*.patch")):
        touched = [
            line[len("+++ b/") :].strip()
            for line in change.read_text().splitlines()
            if line.startswith("+++ b/")
        ]
        if not all(name in files for name in touched):
            log(f"{change.name}: not applied ({', '.join(touched)} not in the local copy)")
            continue
        for mode in (["--check"], []):
            result = subprocess.run(
                ["git", "apply", "--verbose", *mode, str(change.resolve())],
                cwd=target,
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                break
        if result.returncode != 0:
            errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
            log(f"{change.name} does not apply to the local copy: {'; '.join(errors[-2:])}")
            not_comparable.update(touched)
            continue
        applied.append(change.name)
    return applied, not_comparable


def _run_upstream_test(python: Path, root: Path, selector: str, extra: list[str]) -> dict:
    """One selector's pytest run: its summary line and the ids that failed or errored."""
    cmd = [str(python), "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", selector, *extra]
    environ = {**os.environ, "SGLANG_PLUGINS": "none"}
    result = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=environ, check=False)
    lines = result.stdout.splitlines()
    failed = sorted(
        # "FAILED path::test - message", "SUBFAILED(case) path::test - message"
        line.split(" - ", 1)[0].removeprefix("FAILED ").removeprefix("ERROR ")
        for line in lines
        if line.startswith(("FAILED ", "ERROR ", "SUBFAILED"))
    )
    summary = next((line.strip("= ") for line in reversed(lines) if " in " in line), "no summary")
    return {"code": result.returncode, "summary": summary, "failed": failed}


def upstream_tests(
    release: str,
    tests_dir: Path,
    against: str,
    pytest_args: list[str],
    *,
    changes_dir: Path,
    pythons: Mapping[str, Callable[[], Path]],
) -> int:
    """Upstream's existing tests for the touched files, from a local copy of ``test/``.

    ``stock`` runs them unchanged on the released wheel, ``rebuilt`` runs them, with the
    series' changes to them applied, on the rebuilt wheel; ``both`` compares the two and says
    per file ``same as stock``, ``differs``, or ``not comparable`` when the series' change to
    that file (``upstream-tests/*.patch``) does not apply to the copy given (it then runs
    unchanged on both sides, for the record). Exit status 0 when every comparable file fails
    on the rebuilt side exactly what it fails on stock (the copies may be newer than the
    release, so stock may fail some), 1 otherwise, 2 when no listed file is in the copy. A
    file that is not comparable does not by itself make the status non-zero. Never fetches:
    the copy and the two cached envs are all it uses.

    ``changes_dir`` holds the series' ``*.patch`` changes to these tests; ``pythons`` gives
    each side's interpreter (built on first use).
    """
    files = sorted({test.split("::")[0] for test in UPSTREAM_TESTS})
    present = [name for name in files if (tests_dir / name).is_file()]
    missing = [name for name in files if name not in present]
    if missing:
        log(
            f"not in {tests_dir}, not run: {', '.join(missing)}. Copy sgl-project/sglang's "
            "test/ directory at the v0.5.23 tag there (it is not in the wheel, and this check "
            "never fetches it)."
        )
    if not present:
        return 2
    sides = ["stock", "rebuilt"] if against == "both" else [against]
    scratch = cache_root() / "patched" / f"upstream-tests-{release}"
    results: dict[str, dict[str, dict]] = {}
    not_comparable: set[str] = set()
    for side in sides:
        root = scratch / side
        _scratch_tests(tests_dir, present, root)
        if side == "rebuilt":
            applied, not_comparable = _apply_test_changes(changes_dir, root, present)
            for name in applied:
                log(f"applied {name} to the rebuilt side's copy")
        python = pythons[side]()
        for selector in UPSTREAM_TESTS:
            if selector.split("::")[0] in present:
                outcome = _run_upstream_test(python, root, selector, pytest_args)
                results.setdefault(selector, {})[side] = outcome
                log(f"{side}: {selector}: {outcome['summary']}")
                for test in outcome["failed"]:
                    log(f"{side}:     failed {test}")
    if against != "both":
        failing = [
            selector
            for selector, outcome in results.items()
            if outcome[against]["code"] != 0 and selector.split("::")[0] not in not_comparable
        ]
        return 1 if failing else 0
    return _compare(release, results, not_comparable)


def _compare(release: str, results: dict[str, dict[str, dict]], not_comparable: set[str]) -> int:
    """One line per file (``same as stock``, ``differs``, ``not comparable``); 1 if any
    comparable file differs."""
    differing, comparable = [], 0
    for selector, outcome in results.items():
        if selector.split("::")[0] in not_comparable:
            verdict = "not comparable (the series' change does not apply to this copy)"
        elif outcome["rebuilt"]["failed"] == outcome["stock"]["failed"]:
            comparable += 1
            verdict = f"same as stock ({outcome['rebuilt']['summary']})"
        else:
            comparable += 1
            differing.append(selector)
            verdict = (
                f"differs (stock: {outcome['stock']['summary']}; "
                f"rebuilt: {outcome['rebuilt']['summary']})"
            )
        log(f"{selector}: {verdict}")
    log(
        f"{comparable - len(differing)} of {comparable} comparable files as on stock {release}; "
        f"{len(results) - comparable} not comparable"
    )
    return 1 if differing else 0
