"""Install NVIDIA Dynamo's released SGLang sidecar into a Python environment (idempotent).

The released consumer of the follower metadata contract is the module ``dynamo.sglang.sidecar``
from the ``ai-dynamo`` and ``ai-dynamo-runtime`` wheels. Their declared dependencies pull in a
full serving stack (transformers and more), but the sidecar itself needs only ``pydantic`` and
``uvloop`` beside them at import time. So both wheels go in with ``--no-deps``, and ``pydantic``
(with its own small dependencies) and ``uvloop`` are added only when the environment lacks them:
an SGLang environment already has both, and its pinned versions are left alone.

    python scripts/dynamo_env.py --python ENV/bin/python [--version 1.6.1]

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
# What ai-dynamo-runtime declares for pydantic; used only when the environment has none.
PYDANTIC_REQUIREMENT = "pydantic>=2.10.6,<=2.13.5"
UVLOOP_REQUIREMENT = "uvloop"

# Run inside the target environment: versions present, and whether the provider imports.
_PROBE = r"""
import importlib, importlib.metadata as md, json
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
report = {name: version(name) for name in ("ai-dynamo", "ai-dynamo-runtime", "pydantic", "uvloop")}
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
    extras = []
    if before["pydantic"] is None:
        extras.append(PYDANTIC_REQUIREMENT)
    if before["uvloop"] is None:
        extras.append(UVLOOP_REQUIREMENT)
    if extras:
        _pip_install(python, extras, no_deps=False, quiet=quiet, environ=env)

    after = probe(python, env)
    if not _is_complete(after, version):
        raise DynamoInstallError(
            f"{PROVIDER_MODULE} is not usable in {python} after the install: {json.dumps(after)}"
        )
    logger.info(
        "installed ai-dynamo %s for %s (pydantic %s, uvloop %s)",
        version,
        python,
        after["pydantic"],
        after["uvloop"],
    )
    return after


def _is_complete(report: dict, version: str) -> bool:
    return (
        all(report[name] == version for name in DYNAMO_DISTRIBUTIONS)
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
    parser.add_argument("--python", required=True, help="interpreter of the target environment")
    parser.add_argument("--version", default=DEFAULT_VERSION, help="ai-dynamo release")
    parser.add_argument("--verbose", action="store_true", help="show pip's output")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        report = install_dynamo(args.python, args.version, quiet=not args.verbose)
    except DynamoInstallError as exc:
        logger.error("%s", exc)
        return 1
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
