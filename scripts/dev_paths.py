"""Where the repository's own modules are found: the one place ``PYTHONPATH`` is set.

Standard library only. Each tree is importable where it runs, without ``PYTHONPATH``:

- a script has ``scripts/`` (its own folder), and the unit tier has it too (``pyproject.toml``'s
  ``pythonpath``);
- ``test-registered/`` puts itself on the path (its rootdir ``conftest.py``), and every harness
  child runs ``python -m overlay_harness.…`` from that folder (``-m`` puts the working
  directory first), the processes it spawns inheriting both;
- the package is installed (a wheel), or read from the source tree by :func:`package_module`
  for the standard-library-only modules the scripts need before any install.

A child that needs more than that (a benchmark program in an SGLang env: a copy of the
installed package, ``bench`` and the harness; a helper with the unit tier's fixtures) gets its
environment from :func:`child_environ`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_SOURCE = ROOT / "python"
SCRIPTS = ROOT / "scripts"
TESTS = ROOT / "tests"
HARNESS = ROOT / "test-registered"


def child_environ(
    *paths: str | os.PathLike[str],
    environ: Mapping[str, str] | None = None,
    inherit: bool = True,
) -> dict[str, str]:
    """``environ`` (this process's by default) for a child that imports from ``paths`` first,
    then from what ``environ``'s ``PYTHONPATH`` held (unless ``inherit`` is False)."""
    child = dict(os.environ if environ is None else environ)
    parts = [str(path) for path in paths if str(path)]
    if inherit and child.get("PYTHONPATH"):
        parts.append(child["PYTHONPATH"])
    child.pop("PYTHONPATH", None)
    if parts:
        child["PYTHONPATH"] = os.pathsep.join(parts)
    return child


def package_module(name: str) -> ModuleType:
    """``sglang_sidecar_overlay.<name>``, a standard-library-only module of the package: the
    installed one, else the source tree's (scripts run before any install, with any Python)."""
    if str(PACKAGE_SOURCE) not in sys.path:
        # Last: an installed package (with its native module) is never shadowed.
        sys.path.append(str(PACKAGE_SOURCE))
    return importlib.import_module(f"sglang_sidecar_overlay.{name}")
