#!/usr/bin/env python3
"""Build cached SGLang environments and run ``test-registered/`` inside them.

Runs on the developer's or CI's machine with any Python >= 3.10 and only the standard
library. Each supported SGLang release gets its own virtualenv under the cache directory
(``$SGLANG_OVERLAY_CACHE``, default ``~/.cache/sglang-sidecar-overlay``)::

    envs/sglang-<release>-<key>/   key = hash of everything the env was built from

An env holds ``sglang==<release>`` installed with ``--no-deps`` over the release's pinned
torch/transformers and the few dozen packages SGLang imports at module level (the GPU
kernels it also declares are left out: nothing here runs a model). The heavy torch wheels
are shared through one uv package cache, which uv hard-links into every env, so a second
release with the same torch pin costs seconds and little disk. An env is reused only when
its ``.complete`` marker exists; a half-built one is wiped and rebuilt.

The project's wheel is (re)installed into each env on every ``test`` run, so cached envs
never test stale code.

    scripts/sglang_envs.py build --releases 0.5.21,0.5.23
    scripts/sglang_envs.py test  --releases all --wheel-dir dist [-- extra pytest args]
    scripts/sglang_envs.py test  --patched --releases 0.5.23 --wheel-dir dist [-- ...]
    scripts/sglang_envs.py test  --releases ci --with-patched --jobs 2 --wheel-dir dist
    scripts/sglang_envs.py path  0.5.23
    scripts/sglang_envs.py demo  --wheel-dir dist

``--patched`` runs the same files in ``envs/sglang-0.5.23-patched-<key>/``, which holds the
rebuilt wheel of ``scripts/patches.py`` instead of PyPI's (reinstalled when it changes), with
the nodes' ``SGLANG_PLUGINS`` excluding the overlay; it first prints the proof that the plugin
is not loaded there. ``--with-patched`` adds that session to the releases' ones.

``--jobs N`` runs up to N sessions (one pytest run per env) side by side: a session spends
most of its time in one process importing SGLang, so on two cores two sessions take little
longer than one. Each session's output goes to a file, printed whole when it ends; the
sessions pick test ports from disjoint shares of the port range.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UV_VERSION = "0.13.9"
# Bumped whenever the recipe below changes in a way the key would not otherwise see.
RECIPE_VERSION = 1

# Release -> (torch, transformers). The same pins SGLang's own metadata declares.
PINS = {
    "0.5.19": ("2.13.0", "5.12.1"),
    "0.5.20": ("2.13.0", "5.12.1"),
    "0.5.21": ("2.13.0", "5.12.1"),
    "0.5.22": ("2.14.1", "5.19.0"),
    "0.5.23": ("2.14.1", "5.19.0"),
}


def _load_releases():
    """The package's release table, loaded by path: this script runs before any install."""
    import importlib.util

    path = ROOT / "python" / "sglang_sidecar_overlay" / "releases.py"
    spec = importlib.util.spec_from_file_location("_overlay_releases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RELEASES = _load_releases()
DEFAULT_RELEASES = RELEASES.CI_RELEASES
if set(PINS) != set(RELEASES.SUPPORTED_VERSIONS):
    raise SystemExit(
        f"scripts/sglang_envs.py pins {sorted(PINS)} but the package supports "
        f"{list(RELEASES.SUPPORTED_VERSIONS)}: add or drop the pins"
    )

# Packages SGLang imports at module level on the launch path (engine, scheduler, DP
# controller, HTTP server, launch_server, sglang.test). Versions come from the release's own
# Requires-Dist when it names them, so each env matches what a real install would pick.
IMPORT_TIME_DEPS = (
    "aiohttp",
    "anthropic",
    "blobfile",
    "compressed-tensors",
    "datasets",
    "distro",
    "easydict",
    "einops",
    "fastapi",
    "gguf",
    "interegular",
    "ipython",
    "msgspec",
    "numpy",
    "openai",
    "orjson",
    "packaging",
    "partial-json-parser",
    "pillow",
    "prometheus-client",
    "psutil",
    "pybase64",
    "pydantic",
    "python-multipart",
    "pyzmq",
    "requests",
    "sentencepiece",
    "setproctitle",
    "smg-grpc-servicer",
    "soundfile",
    "tiktoken",
    "torch",
    "torchvision",
    "tqdm",
    "transformers",
    "uvicorn",
    "uvloop",
    "watchfiles",
    "xgrammar",
    "xxhash",
    "zstandard",
)
# Imported by SGLang but not declared by it (arrive transitively in a full install).
UNDECLARED_DEPS = ("dill", "jsonschema", "pyyaml", "huggingface-hub")
# Declared by SGLang and used at run time, not import time: 0.5.19-0.5.20 JIT-build their radix
# cache's native block hash with ninja on the first request that inserts a page.
RUNTIME_TOOLS = ("ninja",)
# What the tests themselves need next to SGLang and the project's wheel.
TEST_DEPS = (
    "pytest>=8",
    "pytest-timeout>=2.3",
    "jsonschema>=4.20",
    "grpcio>=1.60",
    "grpcio-health-checking>=1.60",
    "msgspec>=0.18",
)


def log(message: str) -> None:
    print(f"[sglang-envs] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    configured = os.environ.get("SGLANG_OVERLAY_CACHE")
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "sglang-sidecar-overlay"


def parse_releases(text: str | None) -> list[str]:
    raw = text or os.environ.get("SGLANG_OVERLAY_RELEASES") or ",".join(DEFAULT_RELEASES)
    if raw.strip() == "all":
        return list(RELEASES.SUPPORTED_VERSIONS)
    if raw.strip() == "ci":
        return list(DEFAULT_RELEASES)
    releases = [item for item in raw.replace(",", " ").split() if item]
    unknown = [release for release in releases if release not in PINS]
    if unknown:
        raise SystemExit(
            f"unsupported release(s) {unknown}; choose from {list(PINS)}, 'ci' or 'all'"
        )
    return releases


def run(cmd: Sequence[str | os.PathLike], **kwargs) -> subprocess.CompletedProcess:
    log("$ " + " ".join(str(part) for part in cmd))
    return subprocess.run([str(part) for part in cmd], check=True, **kwargs)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock, so two runs sharing a cache never build the same env at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def uv_binary() -> Path:
    """A pinned uv, bootstrapped once into the cache from PyPI."""
    tools = cache_dir() / "tools" / f"uv-{UV_VERSION}"
    uv = tools / "bin" / "uv"
    with locked(tools.parent / f"uv-{UV_VERSION}.lock"):
        if not (tools / ".complete").exists():
            shutil.rmtree(tools, ignore_errors=True)
            run([sys.executable, "-m", "venv", tools])
            run([tools / "bin" / "python", "-m", "pip", "install", "-q", f"uv=={UV_VERSION}"])
            (tools / ".complete").write_text(UV_VERSION)
    return uv


def uv_env() -> dict[str, str]:
    env = dict(os.environ)
    env["UV_CACHE_DIR"] = str(cache_dir() / "uv")
    # Hard links share the torch files between envs; uv falls back to copies across devices.
    env["UV_LINK_MODE"] = "hardlink"
    env.pop("VIRTUAL_ENV", None)
    return env


def env_key(release: str, python: str, patched: bool = False) -> str:
    torch, transformers = PINS[release]
    recipe: dict[str, object] = {
        "recipe": RECIPE_VERSION,
        "release": release,
        "python": python,
        "uv": UV_VERSION,
        "torch": torch,
        "transformers": transformers,
        "deps": IMPORT_TIME_DEPS,
        "undeclared": UNDECLARED_DEPS,
        "runtime": RUNTIME_TOOLS,
        "test": TEST_DEPS,
    }
    if patched:
        recipe["sglang"] = "rebuilt wheel, reinstalled when it changes"
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def env_path(release: str, patched: bool = False) -> Path:
    """The env of ``release``; ``patched``: the env that holds a rebuilt ``release`` wheel."""
    key = env_key(release, python_version(), patched)
    return cache_dir() / "envs" / f"sglang-{release}-{'patched-' if patched else ''}{key}"


def install_sglang_wheel(env: Path, sglang_wheel: Path) -> None:
    """(Re)install a rebuilt sglang wheel into a patched env, unless it is already there."""
    marker = env / ".sglang-wheel"
    digest = hashlib.sha256(sglang_wheel.read_bytes()).hexdigest()
    if marker.exists() and marker.read_text() == digest:
        return
    marker.unlink(missing_ok=True)
    reinstall_wheel(env, sglang_wheel, "--compile-bytecode")
    marker.write_text(digest)


def reinstall_wheel(env: Path, wheel: Path, *extra: str) -> None:
    """``wheel`` into ``env`` over whatever version is there, its dependencies left alone."""
    python = env / "bin" / "python"
    run(
        [uv_binary(), "pip", "install", "-q", "--python", python, "--no-deps", "--reinstall",
         *extra, wheel],
        env=uv_env(),
    )  # fmt: skip


def _requirement_name(requirement: str) -> str:
    name = requirement
    for stop in "<>=!~;[ (":
        name = name.split(stop, 1)[0]
    return name.strip().lower().replace("_", "-")


def pinned_requirements(env: Path) -> list[str]:
    """The release's own Requires-Dist lines for the import-time packages, markers kept."""
    script = "import json, importlib.metadata as m; print(json.dumps(m.requires('sglang') or []))"
    out = subprocess.run(
        [str(env / "bin" / "python"), "-c", script],
        check=True,
        capture_output=True,
        text=True,
        cwd=env,
    ).stdout
    wanted = set(IMPORT_TIME_DEPS)
    chosen = {}
    for requirement in json.loads(out):
        if "extra ==" in requirement:
            continue
        name = _requirement_name(requirement)
        if name in wanted:
            chosen[name] = requirement
    for name in IMPORT_TIME_DEPS:
        chosen.setdefault(name, name)
    return [chosen[name] for name in IMPORT_TIME_DEPS]


def build_env(release: str, sglang_wheel: Path | None = None) -> Path:
    """The cached env for ``release``, built when missing. Returns its directory.

    ``sglang_wheel`` installs that wheel (a rebuilt ``release``, see ``scripts/patches.py``)
    in place of ``sglang==<release>`` from PyPI; everything else is the same recipe.
    """
    env = env_path(release, patched=sglang_wheel is not None)
    torch, transformers = PINS[release]
    with locked(env.with_name(env.name + ".lock")):
        if (env / ".complete").exists():
            log(f"{release}: cached env {env}")
            if sglang_wheel is not None:
                install_sglang_wheel(env, sglang_wheel)
            return env
        started = time.monotonic()
        shutil.rmtree(env, ignore_errors=True)
        uv = uv_binary()
        uvenv = uv_env()
        run([uv, "venv", "-q", "--python", sys.executable, env], env=uvenv)
        python = env / "bin" / "python"
        sglang = str(sglang_wheel) if sglang_wheel is not None else f"sglang=={release}"
        run([uv, "pip", "install", "-q", "--python", python, "--no-deps", sglang], env=uvenv)
        requirements = pinned_requirements(env)
        # torch/transformers constrained explicitly, so a loose line elsewhere cannot move them.
        constraints = env / "constraints.txt"
        constraints.write_text(f"torch=={torch}\ntransformers=={transformers}\n")
        run(
            [
                uv,
                "pip",
                "install",
                "-q",
                "--compile-bytecode",
                "--python",
                python,
                "-c",
                constraints,
                *requirements,
                *UNDECLARED_DEPS,
                *RUNTIME_TOOLS,
                *TEST_DEPS,
            ],
            env=uvenv,
        )
        # The --no-deps install above was not byte-compiled; the first import of SGLang would
        # otherwise pay for compiling it inside a test's deadline.
        run([python, "-m", "compileall", "-q", "-j", "0", _site_packages(env) / "sglang"])
        check_imports(python)
        if sglang_wheel is not None:
            (env / ".sglang-wheel").write_text(
                hashlib.sha256(sglang_wheel.read_bytes()).hexdigest()
            )
        (env / ".complete").write_text(json.dumps({"release": release, "torch": torch}))
        log(f"{release}: built {env} in {time.monotonic() - started:.0f} s")
    return env


def _site_packages(env: Path) -> Path:
    return env / "lib" / f"python{python_version()}" / "site-packages"


IMPORT_CHECK = (
    "import sglang.srt.entrypoints.engine, sglang.srt.managers.scheduler, "
    "sglang.srt.managers.data_parallel_controller, sglang.srt.entrypoints.http_server, "
    "sglang.test.test_utils, sglang.test.ci.ci_register"
)


def check_imports(python: Path) -> None:
    """Fail the build, not a test, when an import-time dependency is missing."""
    run([python, "-W", "ignore", "-c", IMPORT_CHECK], cwd=python.parent)


def find_wheel(wheel_dir: Path) -> Path:
    wheels = sorted(wheel_dir.glob("sglang_sidecar_overlay-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected exactly one project wheel in {wheel_dir}, found {wheels}")
    return wheels[0].resolve()


def install_project(env: Path, wheel: Path) -> None:
    reinstall_wheel(env, wheel)


# The test-only SGLang platform that runs SGLang's real scheduler on the CPU
# (test-registered/cpu_platform): never part of the project's wheel.
TEST_PLATFORM = ROOT / "test-registered" / "cpu_platform"


def install_test_platform(env: Path) -> None:
    """(Re)install the CPU test platform into ``env``, so a session never tests a stale one."""
    run(
        [uv_binary(), "pip", "install", "-q", "--python", env / "bin" / "python", "--no-deps",
         "--reinstall", TEST_PLATFORM],
        env=uv_env(),
    )  # fmt: skip


def prepare_session_env(env: Path, wheel: Path) -> None:
    """What every session's env gets fresh: the project's wheel, the test platform, and the
    released consumer (idempotent)."""
    install_project(env, wheel)
    install_test_platform(env)
    install_consumer(env)


def install_consumer(env: Path) -> None:
    """The released Dynamo sidecar, the real client of the contract; idempotent (~0.4 s)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from dynamo_env import install_dynamo

    # dynamo_env installs with the env's pip or the uv on PATH; these envs have no pip.
    uv = uv_binary()
    os.environ.update(uv_env())
    os.environ["PATH"] = f"{uv.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    install_dynamo(env / "bin" / "python")


# What the nodes' SGLANG_PLUGINS is set to in a --patched run: an allow-list naming no
# installed plugin, so SGLang skips sidecar_overlay (test-registered's harness reads it).
NO_PLUGIN = "none"
PLUGINS_ENV = "SGLANG_OVERLAY_TEST_PLUGINS"
# The scenario files compared on both sides (patches/DIFFERENCES.md says why the others are not).
EQUIVALENCE_FILES = (
    "test-registered/entrypoints/test_follower_metadata.py",
    "test-registered/contract/test_two_node_group.py",
    "test-registered/sidecar/test_sidecar_launch.py",
    "test-registered/disaggregation/test_ordinary_dp_bootstrap_rank.py",
)
# Tells the tests which side they run on (test-registered/overlay_harness/differences.py).
SIDE_ENV, REBUILT_WHEEL = "SGLANG_OVERLAY_TEST_SIDE", "rebuilt-wheel"
PLUGIN_PROOF = (
    "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout); "
    "from sglang.srt.plugins import load_plugins; load_plugins(); "
    "from sglang_sidecar_overlay import plugin; "
    "print('overlay adapter:', plugin.installed_adapter())"
)


def prove_plugin_absent(env: Path) -> None:
    """Show, in the env and with the nodes' SGLANG_PLUGINS, that the plugin is not loaded."""
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    environ["SGLANG_PLUGINS"] = NO_PLUGIN
    python = env / "bin" / "python"
    out = subprocess.run(
        [python, "-W", "ignore", "-c", PLUGIN_PROOF],
        env=environ, cwd=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    status = subprocess.run(
        [env / "bin" / "sglang-sidecar-overlay", "status"],
        env=environ, cwd=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = [line for line in out.splitlines() if "sidecar_overlay" in line or "overlay" in line]
    for line in lines + status.stdout.splitlines():
        log(f"patched: {line}")
    if "overlay adapter: None" not in out or "sglang-sidecar-overlay: SGLang" in out:
        raise SystemExit("the overlay plugin loaded in the patched env")
    if status.returncode == 0:
        raise SystemExit("sglang-sidecar-overlay status says active in the patched env")
    log("patched: plugin not loaded (status exit code 1: inactive)")


def names_paths(pytest_args: Sequence[str]) -> bool:
    """Whether the pytest arguments name test paths (which replace the default ones)."""
    return any(not arg.startswith("-") for arg in pytest_args)


@dataclasses.dataclass
class Session:
    """One pytest run of ``test-registered/`` in one env."""

    label: str
    env: Path
    pytest_args: Sequence[str]
    extra_env: dict[str, str] = dataclasses.field(default_factory=dict)

    def command(self) -> list[str]:
        # Paths given after "--" replace the default of the whole tree.
        targets = [] if names_paths(self.pytest_args) else [ROOT / "test-registered"]
        cmd = [
            self.env / "bin" / "python",
            "-m",
            "pytest",
            "-c",
            ROOT / "test-registered" / "pytest.ini",
            "--rootdir",
            ROOT / "test-registered",
            *targets,
            *self.pytest_args,
        ]
        return [str(part) for part in cmd]

    def environ(self, port_share: str | None) -> dict[str, str]:
        environ = dict(os.environ)
        environ.pop("VIRTUAL_ENV", None)
        # The project is tested as installed: the source tree must not shadow the wheel.
        environ.pop("PYTHONPATH", None)
        environ.update(self.extra_env)
        # As an activated env: its tools (ninja) on PATH; JIT-built extensions kept per env,
        # since every release's torch would otherwise share one build directory.
        environ["PATH"] = f"{self.env / 'bin'}{os.pathsep}{environ.get('PATH', '')}"
        environ["TORCH_EXTENSIONS_DIR"] = str(self.env / "torch-extensions")
        if port_share is not None:
            environ[PORT_SHARE_ENV] = port_share
        return environ


# Sessions run side by side pick test ports from disjoint shares of the port range
# (test-registered/overlay_harness/cluster.py reads it): "<index>/<count>".
PORT_SHARE_ENV = "SGLANG_OVERLAY_TEST_PORT_SHARE"
HEARTBEAT_SECONDS = 120.0


def run_sessions(sessions: list[Session], jobs: int) -> list[str]:
    """Run every session, up to ``jobs`` at once; returns the labels of those that failed.

    One at a time, pytest writes straight to this terminal. Side by side, each session writes
    to its own file, printed whole when it ends, so every session's output stays in one piece
    and ends with its pytest summary line.
    """
    if jobs <= 1 or len(sessions) == 1:
        failed = []
        for session in sessions:
            log(f"{session.label}: running test-registered")
            code = subprocess.run(
                session.command(), env=session.environ(None), cwd=ROOT, check=False
            ).returncode
            if code != 0:
                failed.append(session.label)
        return failed
    with tempfile.TemporaryDirectory(prefix="sglang-envs-") as logs:
        return _run_side_by_side(sessions, jobs, Path(logs))


def _run_side_by_side(sessions: list[Session], jobs: int, logs: Path) -> list[str]:
    waiting = list(enumerate(sessions))
    running: dict[int, tuple[subprocess.Popen, Path, float]] = {}
    failed: list[str] = []
    heartbeat = time.monotonic() + HEARTBEAT_SECONDS
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                index, session = waiting.pop(0)
                out = logs / f"{index}.log"
                with open(out, "wb") as sink:
                    proc = subprocess.Popen(
                        session.command(),
                        env=session.environ(f"{index}/{len(sessions)}"),
                        cwd=ROOT,
                        stdout=sink,
                        stderr=subprocess.STDOUT,
                    )
                running[index] = (proc, out, time.monotonic())
                log(f"{session.label}: running test-registered (output when it ends)")
            for index, (proc, out, started) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[index]
                label, seconds = sessions[index].label, time.monotonic() - started
                log(f"---- {label}: exit {proc.returncode} after {seconds:.0f} s")
                sys.stdout.flush()
                sys.stdout.buffer.write(out.read_bytes())
                sys.stdout.flush()
                if proc.returncode != 0:
                    failed.append(label)
            if running and time.monotonic() > heartbeat:
                names = ", ".join(sessions[index].label for index in running)
                log(f"still running: {names}")
                heartbeat = time.monotonic() + HEARTBEAT_SECONDS
            time.sleep(1.0)
    finally:
        for proc, _, _ in running.values():
            proc.kill()
            proc.wait()
    return failed


def main(argv: Sequence[str] | None = None) -> int:
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
            sub.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    demo = commands.add_parser(
        "demo", help="KV-aware routing to a follower (scripts/demo_routing.py)"
    )
    demo.add_argument("--wheel-dir", type=Path, default=ROOT / "dist")
    path = commands.add_parser("path")
    path.add_argument("release", choices=list(PINS))
    args = parser.parse_args(argv)

    if args.command == "path":
        print(env_path(args.release))
        return 0

    if args.command == "demo":
        return run_demo(find_wheel(args.wheel_dir))

    releases = parse_releases(args.releases)
    wheel = find_wheel(args.wheel_dir) if args.command == "test" else None
    if args.command == "test" and args.patched:
        sessions = [patched_session(releases, wheel, args.pytest_args)]
        return report(run_sessions(sessions, 1), sessions)
    timings = {}
    for release in releases:
        started = time.monotonic()
        build_env(release)
        timings[release] = time.monotonic() - started
    for release, seconds in timings.items():
        log(f"{release}: env ready in {seconds:.1f} s")
    if args.command == "build":
        return 0

    sessions = []
    for release in releases:
        env = env_path(release)
        prepare_session_env(env, wheel)
        sessions.append(Session(release, env, args.pytest_args))
    if args.with_patched:
        sessions.append(patched_session([patches_module().RELEASE], wheel, args.pytest_args))
    return report(run_sessions(sessions, args.jobs), sessions)


DEMO_RELEASE = "0.5.23"


def run_demo(wheel: Path) -> int:
    """``scripts/demo_routing.py`` in the 0.5.23 env, as a session's env runs it."""
    env = build_env(DEMO_RELEASE)
    prepare_session_env(env, wheel)
    environ = Session(DEMO_RELEASE, env, []).environ(None)
    environ["PYTHONPATH"] = str(ROOT / "test-registered")
    command = [str(env / "bin" / "python"), str(ROOT / "scripts" / "demo_routing.py")]
    return subprocess.run(command, env=environ, cwd=ROOT / "test-registered").returncode


def report(failed: list[str], sessions: list[Session]) -> int:
    if failed:
        log(f"test-registered failed on {', '.join(failed)}")
        return 1
    log(f"test-registered passed on {', '.join(session.label for session in sessions)}")
    return 0


def patches_module():
    sys.path.insert(0, str(ROOT / "scripts"))
    import patches

    return patches


def patched_session(releases: list[str], wheel: Path, pytest_args: Sequence[str]) -> Session:
    """The same test-registered files against the rebuilt wheel, the plugin not loaded."""
    patches = patches_module()
    if releases != [patches.RELEASE]:
        raise SystemExit(f"--patched runs on {patches.RELEASE} only (the series' base)")
    _, env = patches.patched_env(patches.RELEASE)
    prepare_session_env(env, wheel)
    prove_plugin_absent(env)
    if not names_paths(pytest_args):
        pytest_args = [*pytest_args, *(str(ROOT / path) for path in EQUIVALENCE_FILES)]
    sides = {PLUGINS_ENV: NO_PLUGIN, SIDE_ENV: REBUILT_WHEEL}
    return Session(f"{patches.RELEASE} (rebuilt wheel)", env, pytest_args, sides)


if __name__ == "__main__":
    sys.exit(main())
