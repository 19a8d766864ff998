"""Prefill/decode KV transfer in the SGLang test envs: Mooncake's CPU build and its libraries.

Standard library only. SGLang's ``--disaggregation-transfer-backend mooncake_tcp`` moves KV
pages between a prefill and a decode server over Mooncake's TCP transport, which needs no GPU
and no RDMA device. An env whose SGLang release offers that backend gets
``mooncake-transfer-engine-non-cuda`` (pinned) at build time (``envs.build_env`` calls
:func:`install`), and the marker file :data:`MARKER` in the env says so; an env without it
runs no disaggregation test (the test names what is missing).

Mooncake's engine links against ``libibverbs.so.1`` and ``libnl-route-3.so.200`` even when it
only speaks TCP. They come from Debian's packages, unpacked (``apt-get download`` and
``dpkg-deb -x``, nothing installed on the system) into a directory of the cache keyed by the
packages' versions::

    system-libs/mooncake-<key>/    key = hash of "package=version" of every package below

and the test session hands that directory to every node in ``LD_LIBRARY_PATH``
(:func:`session_environ`, read by ``sessions.Session``), as an operator's image would carry the
libraries.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cache import cache_root, locked

BACKEND = "mooncake_tcp"
MOONCAKE = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
# What Mooncake's engine loads at import ("ImportError: libibverbs.so.1", then
# "libnl-route-3.so.200"), from Debian.
SYSTEM_PACKAGES = ("libibverbs1", "libnl-3-200", "libnl-route-3-200")
# In the env: which backend it can run and where its system libraries are.
MARKER = ".pd-transfer.json"
# What the env build hashes into its key (envs.env_key): the wheel and the packages, by name.
RECIPE = {"backend": BACKEND, "python": MOONCAKE, "debian": SYSTEM_PACKAGES}

_HAS_BACKEND = (
    "from sglang.srt.arg_groups.choices import DISAGG_TRANSFER_BACKEND_CHOICES as c; "
    f"print({BACKEND!r} in c)"
)
_IMPORT_CHECK = "import mooncake.engine; print(mooncake.engine.TransferEngine)"


def _log(message: str) -> None:
    print(f"[sglang-envs] {message}", file=sys.stderr, flush=True)


def _run(cmd: Sequence[str | os.PathLike], **kwargs) -> subprocess.CompletedProcess:
    _log("$ " + " ".join(str(part) for part in cmd))
    return subprocess.run([str(part) for part in cmd], check=True, **kwargs)


def release_has_backend(python: Path) -> bool:
    """Whether the SGLang installed for ``python`` offers ``--disaggregation-transfer-backend
    mooncake_tcp`` (read from its own list of choices; releases without that list have none)."""
    proc = subprocess.run(
        [str(python), "-W", "ignore", "-c", _HAS_BACKEND],
        capture_output=True,
        text=True,
        cwd=python.parent,
    )
    return proc.returncode == 0 and proc.stdout.strip() == "True"


def debian_versions() -> dict[str, str]:
    """The candidate version of every system package (``apt-get update`` once when the
    package lists do not know one yet, as on a fresh machine)."""
    for attempt in range(2):
        versions = {}
        for package in SYSTEM_PACKAGES:
            out = subprocess.run(
                ["apt-cache", "policy", package], capture_output=True, text=True
            ).stdout
            for line in out.splitlines():
                key, _, value = line.strip().partition(":")
                if key == "Candidate" and value.strip() not in ("", "(none)"):
                    versions[package] = value.strip()
        if len(versions) == len(SYSTEM_PACKAGES):
            return versions
        if attempt == 0:
            _run(["apt-get", "update", "-q"], stdout=subprocess.DEVNULL)
    missing = sorted(set(SYSTEM_PACKAGES) - set(versions))
    raise SystemExit(f"no Debian package version known for {missing} (apt-cache policy)")


def system_library_path() -> str:
    """The unpacked system libraries' directories (``LD_LIBRARY_PATH`` form: Debian puts
    ``libnl-3`` under ``/lib`` and the others under ``/usr/lib``), fetched and unpacked once
    per set of package versions."""
    versions = debian_versions()
    pinned = [f"{package}={versions[package]}" for package in SYSTEM_PACKAGES]
    key = hashlib.sha256("\n".join(pinned).encode()).hexdigest()[:12]
    root = cache_root() / "system-libs" / f"mooncake-{key}"
    with locked(root.with_name(root.name + ".lock")):
        if not (root / ".complete").exists():
            shutil.rmtree(root, ignore_errors=True)
            (root / "root").mkdir(parents=True)
            with tempfile.TemporaryDirectory(prefix="pd-transfer-debs-") as downloads:
                _run(["apt-get", "download", "-q", *pinned], cwd=downloads)
                for deb in sorted(Path(downloads).glob("*.deb")):
                    _run(["dpkg-deb", "-x", deb, root / "root"])
            (root / ".complete").write_text(json.dumps(pinned))
    directories = sorted({str(found.parent) for found in (root / "root").rglob("*.so.*")})
    if not directories:
        raise SystemExit(f"{root}: no shared library in the unpacked {pinned}")
    return os.pathsep.join(directories)


def install(env: Path, uv: Path, uv_environ: dict[str, str]) -> None:
    """Mooncake and its system libraries for ``env``, when its release has the backend;
    checked by importing Mooncake's engine the way a node does."""
    python = env / "bin" / "python"
    (env / MARKER).unlink(missing_ok=True)
    if not release_has_backend(python):
        _log(f"{env.name}: SGLang has no {BACKEND} transfer backend; no Mooncake")
        return
    # The env's torch/transformers pins hold whatever Mooncake declares.
    constraints = ["-c", env / "constraints.txt"] if (env / "constraints.txt").exists() else []
    _run([uv, "pip", "install", "-q", "--python", python, *constraints, MOONCAKE], env=uv_environ)
    library_path = system_library_path()
    marker = {"backend": BACKEND, "mooncake": MOONCAKE, "library_path": library_path}
    _run([python, "-c", _IMPORT_CHECK], env={**os.environ, **_library_environ(library_path)})
    (env / MARKER).write_text(json.dumps(marker))


def _library_environ(library_path: str) -> dict[str, str]:
    current = os.environ.get("LD_LIBRARY_PATH")
    return {"LD_LIBRARY_PATH": os.pathsep.join(filter(None, [library_path, current]))}


def session_environ(env: Path) -> dict[str, str]:
    """What a test session in ``env`` adds to its environment: the system libraries' directory
    in ``LD_LIBRARY_PATH`` when the env has Mooncake, else nothing."""
    try:
        marker = json.loads((env / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return _library_environ(marker["library_path"])
