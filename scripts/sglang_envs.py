#!/usr/bin/env python3
"""Build cached SGLang environments and run ``test-registered/`` inside them.

Runs on the developer's or CI's machine with any Python >= 3.10 and only the standard
library. This file is the command line; the environments (one per supported SGLang release,
under ``$SGLANG_OVERLAY_CACHE``, default ``~/.cache/sglang-sidecar-overlay``) are built by
``envs.py``, the pytest sessions run by ``sessions.py``, and the rebuilt wheel's session comes
from ``patches.py``.

    scripts/sglang_envs.py build --releases 0.5.21,0.5.23
    scripts/sglang_envs.py test  --releases all --wheel-dir dist [-- extra pytest args]
    scripts/sglang_envs.py test  --patched --releases 0.5.23 --wheel-dir dist [-- ...]
    scripts/sglang_envs.py test  --releases ci --with-patched --jobs 2 --wheel-dir dist
    scripts/sglang_envs.py test  --plan ci --jobs 2 --wheel-dir dist   # make test's pool_plan.py
    scripts/sglang_envs.py path  0.5.23
    scripts/sglang_envs.py demo  --wheel-dir dist

The project's wheel is (re)installed into each env on every ``test`` run, so cached envs
never test stale code.

``--patched`` runs every scenario file (all of ``test-registered/`` but ``unit/``) in
``envs/sglang-0.5.23-patched-<key>/``, which holds the rebuilt wheel of ``scripts/patches.py``
instead of PyPI's (reinstalled when it changes), with the nodes' ``SGLANG_PLUGINS`` excluding
the overlay; it first prints the proof that the plugin is not loaded there.
``--with-patched`` adds that session to the releases' ones.

``--jobs N`` runs up to N sessions (one pytest run per env) side by side: a session
alternates between importing SGLang in a fresh process and waiting on its nodes, so on two
cores three sessions keep both busy. Each session's output goes to a file, printed whole when
it ends; the sessions pick test ports from disjoint shares of the port range. ``--last-job
COMMAND`` queues one more job after the sessions (``make test``: the benchmark's smoke pass),
so it runs in the pool's tail instead of after it.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pool_plan
from dev_paths import HARNESS, child_environ
from envs import (
    DEFAULT_RELEASES,
    PINS,
    RELEASES,
    ROOT,
    build_env,
    env_path,
    find_wheel,
    install_consumer,
    log,
    parse_releases,
    prepare_session_env,
)
from sessions import LastJob, Session, report, run_sessions

import patches


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("build", "test"):
        sub = commands.add_parser(name)
        sub.add_argument(
            "--releases",
            help="comma-separated releases or 'all' (default: $SGLANG_OVERLAY_RELEASES, "
            f"else {','.join(DEFAULT_RELEASES)})",
        )
        if name == "test":
            sub.add_argument("--wheel-dir", type=Path, default=ROOT / "dist")
            sub.add_argument(
                "--patched",
                action="store_true",
                help="run in the env of the rebuilt wheel from patches/ (scripts/patches.py), "
                "with the overlay plugin not loaded",
            )
            sub.add_argument(
                "--with-patched",
                action="store_true",
                help="also run the --patched session, alongside the releases' ones",
            )
            sub.add_argument(
                "--jobs",
                type=int,
                default=1,
                help="sessions run side by side (default 1: one after another, live output)",
            )
            sub.add_argument(
                "--plan",
                choices=sorted(pool_plan.PLANS),
                help="run the named plan's sessions (scripts/pool_plan.py: 'ci' is make test's, "
                "'rest' what it leaves out) instead of every file per release",
            )
            sub.add_argument(
                "--last-job",
                metavar="COMMAND",
                help="a command run as the pool's last job, once a slot is free and no session "
                "waits (the pool's tail); the run fails if it fails",
            )
            sub.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    path = commands.add_parser("path")
    path.add_argument("release", choices=list(PINS))
    demo = commands.add_parser("demo", help="KV-aware routing to a follower (demo_routing.py)")
    demo.add_argument("--wheel-dir", type=Path, default=ROOT / "dist")
    return parser


DEMO_RELEASE = RELEASES.NEWEST_RELEASE


def run_demo(wheel: Path) -> int:
    """``scripts/demo_routing.py`` in the newest release's env, with a session's environment."""
    env = build_env(DEMO_RELEASE)
    prepare_session_env(env, wheel)
    # The demo is a script, not a harness module run with -m: the harness on its path.
    environ = child_environ(HARNESS, environ=Session(DEMO_RELEASE, env, []).environ(None))
    command = [str(env / "bin" / "python"), str(ROOT / "scripts" / "demo_routing.py")]
    return subprocess.run(command, env=environ, cwd=ROOT / "test-registered").returncode


def build_envs(releases: list[str]) -> None:
    """Every release's env, built when missing, with its consumers (``install_consumer``:
    the next Dynamo versions' envs too); how long each took to be ready."""
    timings = {}
    for release in releases:
        started = time.monotonic()
        install_consumer(build_env(release))
        timings[release] = time.monotonic() - started
    for release, seconds in timings.items():
        log(f"{release}: env ready in {seconds:.1f} s")


def release_sessions(
    releases: list[str], with_patched: bool, wheel: Path, pytest_args: Sequence[str]
) -> list[Session]:
    """One session per release over the whole tier, and the rebuilt wheel's if asked."""
    build_envs(releases)
    sessions = []
    for release in releases:
        env = env_path(release)
        prepare_session_env(env, wheel)
        sessions.append(Session(release, env, pytest_args))
    if with_patched:
        sessions.append(patches.patched_session([patches.RELEASE], wheel, pytest_args))
    return sessions


def plan_sessions(
    parts: Sequence[pool_plan.Part], wheel: Path, pytest_args: Sequence[str]
) -> list[Session]:
    """A session per part of a plan (``pool_plan.py``), each on its paths with its budget."""
    build_envs(sorted({part.release for part in parts if not part.rebuilt}))
    prepared: set[Path] = set()
    sessions = []
    for part in parts:
        paths = [str(ROOT / "test-registered" / path) for path in part.paths]
        if part.rebuilt:
            session = patches.patched_session([part.release], wheel, [*paths, *pytest_args])
        else:
            session = Session(part.release, env_path(part.release), [*paths, *pytest_args])
            if session.env not in prepared:
                prepare_session_env(session.env, wheel)
                prepared.add(session.env)
        sessions.append(dataclasses.replace(session, label=part.label, budget=part.budget))
    return sessions


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "path":
        print(env_path(args.release))
        return 0
    if args.command == "demo":
        return run_demo(find_wheel(args.wheel_dir))
    releases = parse_releases(args.releases)
    if args.command == "build":
        build_envs(releases)
        return 0
    wheel = find_wheel(args.wheel_dir)
    if args.patched:
        sessions = [patches.patched_session(releases, wheel, args.pytest_args)]
        return report(run_sessions(sessions, 1), sessions)
    if args.plan:
        sessions = plan_sessions(pool_plan.PLANS[args.plan], wheel, args.pytest_args)
    else:
        sessions = release_sessions(releases, args.with_patched, wheel, args.pytest_args)
    jobs: list[Session | LastJob] = list(sessions)
    if args.last_job:
        jobs.append(LastJob(f"last job ({args.last_job})", shlex.split(args.last_job)))
    return report(run_sessions(jobs, args.jobs), jobs)


if __name__ == "__main__":
    sys.exit(main())
