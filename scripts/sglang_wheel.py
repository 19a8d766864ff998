"""The released sglang wheel, downloaded once into the shared cache (standard library only).

Used by ``scripts/benchmark.py`` (the ``_grpc`` extension out of it) and ``scripts/patches.py``
(the Python tree the upstream patch series applies to). The wheel lands in
``$SGLANG_OVERLAY_CACHE/wheels`` (default ``~/.cache/sglang-sidecar-overlay/wheels``) under
its own file name, fetched with ``pip download --no-deps`` for this interpreter's platform,
and is reused from there; the cache's lock keeps two runs from downloading it at once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cache import cache_root, locked


def wheel_dir() -> Path:
    path = cache_root() / "wheels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def sglang_wheel(release: str) -> Path:
    """The ``sglang==<release>`` wheel file, downloaded on first use."""
    directory = wheel_dir()
    with locked(directory / f"sglang-{release}.lock"):
        wheels = sorted(directory.glob(f"sglang-{release}-*.whl"))
        if not wheels:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--quiet",
                    "--only-binary",
                    ":all:",
                    f"sglang=={release}",
                    "-d",
                    str(directory),
                ],
                check=True,
            )
            wheels = sorted(directory.glob(f"sglang-{release}-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"expected one sglang {release} wheel in {directory}, found {wheels}")
        return wheels[0]
