"""Install NVIDIA Dynamo's released SGLang sidecar into a Python environment (idempotent).

The released consumer of the follower metadata contract is the module ``dynamo.sglang.sidecar``
from the ``ai-dynamo`` and ``ai-dynamo-runtime`` wheels. Their declared dependencies pull in a
full serving stack (transformers and more), but the sidecar itself needs only ``pydantic`` and
``uvloop`` beside them at import time, and the router ``pyyaml``, ``msgspec`` and ``packaging``
too. So both wheels go in with ``--no-deps``, and those five (``pydantic`` with its own small
dependencies) are added only when the environment lacks them:
an SGLang environment already has both, and its pinned versions are left alone.

    python scripts/dynamo_env.py --python ENV/bin/python [--version 1.6.1]
    python scripts/dynamo_env.py --venv DIR --version 1.7.0.dev20261026

``--venv`` makes ``DIR`` an environment of its own holding only that consumer version (the
test tier runs a second Dynamo version beside the one in the SGLang env that way: the
sidecar and the router need nothing of SGLang's).

From another script: ``install_dynamo(python_path, environ=...)``; returns the installed
versions. A second run finds everything in place and installs nothing. Uses the environment's
``pip`` module, or ``uv pip`` (the first on ``environ``'s PATH) for environments created
without pip. ``environ`` is the environment the installers run with (default: this process's);
nothing here changes ``os.environ``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_VERSION = "1.6.1"
PROVIDER_MODULE = "dynamo.sglang.sidecar"
DYNAMO_DISTRIBUTIONS = ("ai-dynamo", "ai-dynamo-runtime")
# What the sidecar and the router import beside the two wheels, each installed only when the
# environment has none; pydantic as ai-dynamo-runtime declares it.
IMPORT_TIME_REQUIREMENTS = {
    "pydantic": "pydantic>=2.10.6,<=2.13.5",
    "uvloop": "uvloop",
    "pyyaml": "pyyaml",
    "msgspec": "msgspec",
    "packaging": "packaging",
}

# Run inside the target environment: versions present, and whether the provider imports.
_PROBE = r"""
import importlib, importlib.metadata as md, json
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
names = ("ai-dynamo", "ai-dynamo-runtime", "pydantic", "uvloop", "pyyaml", "msgspec", "packaging")
report = {name: version(name) for name in names}
try:
    module = importlib.import_module("dynamo.sglang.sidecar")
    report["provider_error"] = None if callable(getattr(module, "main", None)) else "no main(argv)"
except Exception as exc:
    report["provider_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(report))
"""


class DynamoInstallError(RuntimeError):
    """The released sidecar could not be installed or does not import afterwards."""


def probe(python: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> dict:
    """Installed versions of the consumer's distributions and the provider's import status."""
    result = subprocess.run(
        [os.fspath(python), "-c", _PROBE],
        capture_output=True,
        text=True,
        check=False,
        env=_clean_env(environ),
    )
    if result.returncode != 0:
        raise DynamoInstallError(f"{python} cannot run the probe: {result.stderr.strip()}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def install_dynamo(
    python: str | os.PathLike[str],
    version: str = DEFAULT_VERSION,
    *,
    quiet: bool = True,
    environ: Mapping[str, str] | None = None,
) -> dict:
    """Make ``dynamo.sglang.sidecar`` of ``version`` importable by ``python``; idempotent.

    ``environ`` is what the probes and installers run with (default: ``os.environ``). Returns
    the probe report after the install. Raises DynamoInstallError when the provider does not
    import afterwards.
    """
    python = os.fspath(python)
    if not Path(python).exists():
        raise DynamoInstallError(f"no interpreter at {python}")
    env = _clean_env(environ)
    before = probe(python, env)
    if _is_complete(before, version):
        logger.info("ai-dynamo %s already installed for %s", version, python)
        return before

    if any(before[name] != version for name in DYNAMO_DISTRIBUTIONS):
        _pip_install(
            python,
            [f"{name}=={version}" for name in DYNAMO_DISTRIBUTIONS],
            no_deps=True,
            quiet=quiet,
            environ=env,
        )
    extras = [req for name, req in IMPORT_TIME_REQUIREMENTS.items() if before[name] is None]
    if extras:
        _pip_install(python, extras, no_deps=False, quiet=quiet, environ=env)

    after = probe(python, env)
    if not _is_complete(after, version):
        raise DynamoInstallError(
            f"{PROVIDER_MODULE} is not usable in {python} after the install: {json.dumps(after)}"
        )
    logger.info(
        "installed ai-dynamo %s for %s (%s)",
        version,
        python,
        ", ".join(f"{name} {after[name]}" for name in IMPORT_TIME_REQUIREMENTS),
    )
    return after


def consumer_venv(
    venv: str | os.PathLike[str],
    version: str,
    *,
    quiet: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Path:
    """``venv`` as an environment of its own with ``version``'s sidecar and router, made with
    ``uv venv`` (the first on ``environ``'s PATH) when missing; its interpreter. Idempotent."""
    env = _clean_env(environ)
    python = Path(venv) / "bin" / "python"
    if not python.exists():
        uv = shutil.which("uv", path=env.get("PATH"))
        if uv is None:
            raise DynamoInstallError(f"no uv on PATH to create {venv}")
        command = [uv, "venv", "-q", "--python", sys.executable, os.fspath(venv)]
        if subprocess.run(command, check=False, env=env).returncode != 0:
            raise DynamoInstallError(f"creating {venv} failed")
    install_dynamo(python, version, quiet=quiet, environ=env)
    return python


def _is_complete(report: dict, version: str) -> bool:
    return (
        all(report[name] == version for name in DYNAMO_DISTRIBUTIONS)
        and all(report[name] is not None for name in IMPORT_TIME_REQUIREMENTS)
        and report["provider_error"] is None
    )


def _pip_install(
    python: str,
    requirements: Sequence[str],
    *,
    no_deps: bool,
    quiet: bool,
    environ: dict[str, str],
) -> None:
    flags = ["--no-deps"] if no_deps else []
    if quiet:
        flags.append("--quiet")
    has_pip = (
        subprocess.run(
            [python, "-m", "pip", "--version"], capture_output=True, check=False, env=environ
        ).returncode
        == 0
    )
    if has_pip:
        command = [python, "-m", "pip", "install", *flags, *requirements]
    elif (uv := shutil.which("uv", path=environ.get("PATH"))) is not None:
        command = [uv, "pip", "install", "--python", python, *flags, *requirements]
    else:
        raise DynamoInstallError(f"{python} has no pip module and no uv is on PATH")
    logger.info("running %s", " ".join(command))
    result = subprocess.run(command, check=False, env=environ)
    if result.returncode != 0:
        raise DynamoInstallError(
            f"installing {' '.join(requirements)} failed ({result.returncode})"
        )


def _clean_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: ours) minus what would point the target interpreter elsewhere."""
    env = dict(os.environ if environ is None else environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--python", help="interpreter of the target environment")
    target.add_argument("--venv", help="a directory made an environment of its own (uv venv)")
    parser.add_argument("--version", default=DEFAULT_VERSION, help="ai-dynamo release")
    parser.add_argument("--verbose", action="store_true", help="show pip's output")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        python = args.python
        if args.venv is not None:
            python = consumer_venv(args.venv, args.version, quiet=not args.verbose)
        report = install_dynamo(python, args.version, quiet=not args.verbose)
    except DynamoInstallError as exc:
        logger.error("%s", exc)
        return 1
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
