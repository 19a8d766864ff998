"""Cached SGLang environments: the recipe, building one, and what each test session installs.

Standard library only. Each supported SGLang release gets its own virtualenv under the cache
(``cache.cache_root()``)::

    envs/sglang-<release>-<key>/           key = hash of everything the env was built from
    envs/sglang-<release>-patched-<key>/   the same recipe around a rebuilt wheel (patches.py)

An env holds ``sglang==<release>`` installed with ``--no-deps`` over the release's pinned
torch/transformers and the few dozen packages SGLang imports at module level (the GPU
kernels it also declares are left out: nothing here runs a model). The heavy torch wheels
are shared through one uv package cache, which uv hard-links into every env, so a second
release with the same torch pin costs seconds and little disk. A release with SGLang's
``mooncake_tcp`` transfer backend also gets Mooncake's CPU build and its system libraries
(``pd_transfer.py``). An env is reused only when its ``.complete`` marker exists; a half-built
one is wiped and rebuilt.

The project's wheel, the CPU test platform and the released consumer are (re)installed into
each env by :func:`prepare_session_env` on every test run, so cached envs never test stale code.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pd_transfer
from cache import cache_root, locked
from dev_paths import package_module
from dynamo_env import consumer_venv, install_dynamo

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


RELEASES = package_module("releases")
ENTRY_POINT = package_module("entry_point")
DEFAULT_RELEASES = RELEASES.CI_RELEASES
if set(PINS) != set(RELEASES.SUPPORTED_VERSIONS):
    raise SystemExit(
        f"scripts/envs.py pins {sorted(PINS)} but the package supports "
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


def uv_binary() -> Path:
    """A pinned uv, bootstrapped once into the cache from PyPI."""
    tools = cache_root() / "tools" / f"uv-{UV_VERSION}"
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
    env["UV_CACHE_DIR"] = str(cache_root() / "uv")
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
        "pd_transfer": pd_transfer.RECIPE,
    }
    if patched:
        recipe["sglang"] = "rebuilt wheel, reinstalled when it changes"
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def env_path(release: str, patched: bool = False) -> Path:
    """The env of ``release``; ``patched``: the env that holds a rebuilt ``release`` wheel."""
    key = env_key(release, python_version(), patched)
    return cache_root() / "envs" / f"sglang-{release}-{'patched-' if patched else ''}{key}"


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
        pd_transfer.install(env, uv, uvenv)
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
    # Compiled as pip compiles on install: every SGLang process imports the plugin, and a
    # machine with PYTHONDONTWRITEBYTECODE would otherwise compile it from source in each one.
    reinstall_wheel(env, wheel, "--compile-bytecode")


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
    """The released Dynamo sidecar, the real client of the contract, in the SGLang env, and
    each next consumer version in an env of its own (``next_consumer_pythons``); idempotent
    (~0.4 s each once built)."""
    install_dynamo(env / "bin" / "python", environ=_uv_on_path())
    for version in NEXT_CONSUMERS:
        venv = consumer_env_path(version)
        with locked(venv.with_name(venv.name + ".lock")):
            consumer_venv(venv, version, environ=_uv_on_path())


# Consumer versions the tier runs beside the SGLang env's own Dynamo (dynamo_env's default),
# each from its own cached env: the newest published build first.
NEXT_CONSUMERS = ("1.7.0.dev20261026",)
# How a session hands them to test-registered (overlay_harness.dynamo reads it): a JSON
# object {version: interpreter}.
NEXT_CONSUMERS_ENV = "SGLANG_OVERLAY_TEST_DYNAMO_PYTHONS"


def consumer_env_path(version: str) -> Path:
    return cache_root() / "envs" / f"dynamo-{version}-py{python_version()}"


def next_consumer_pythons() -> dict[str, str]:
    """{version: interpreter} of every next consumer version's env."""
    return {v: str(consumer_env_path(v) / "bin" / "python") for v in NEXT_CONSUMERS}


def _uv_on_path() -> dict[str, str]:
    # dynamo_env installs with the env's pip or the uv on PATH; these envs have no pip.
    uv = uv_binary()
    environ = uv_env()
    environ["PATH"] = f"{uv.parent}{os.pathsep}{environ.get('PATH', '')}"
    return environ
