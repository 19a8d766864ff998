"""What every benchmark row shares: paths, the SGLang environment a row runs in, the machine,
process figures from ``/proc``, and how numbers are written in the tables."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from cache import cache_root
from dev_paths import child_environ
from envs import RELEASES

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
# The releases whose cached env a row that needs SGLang uses, first found first: the newest
# and the two before it.
SGLANG_RELEASES = tuple(reversed(RELEASES.SUPPORTED_VERSIONS))[:3]


def bench_cache() -> Path:
    """Where the benchmark keeps its downloads."""
    path = cache_root() / "bench"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- the SGLang environment a row runs in ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SglangEnv:
    """A Python with SGLang installed, and where it came from (for the results' text);
    ``cached`` is the env's directory when this project's scripts built it."""

    python: str
    source: str
    cached: Path | None = None

    def version(self) -> str | None:
        out = subprocess.run(
            [self.python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
            capture_output=True,
            text=True,
        )
        return out.stdout.strip() or None

    def has_distribution(self, name: str) -> bool:
        code = f"import importlib.metadata as m; m.version({name!r})"
        return subprocess.run([self.python, "-c", code], capture_output=True).returncode == 0

    def describe(self) -> str:
        """``SGLang 0.5.23 (cached env sglang 0.5.23)``, or the source alone."""
        version = self.version()
        return f"SGLang {version} ({self.source})" if version else self.source


def find_sglang_env(explicit: str | None) -> tuple[SglangEnv | None, str]:
    """The SGLang environment for the rows that need one, and where it came from (or why
    there is none): ``--sglang-python``, else the first complete cached env."""
    from envs import env_path

    if explicit:
        return SglangEnv(explicit, "--sglang-python"), "--sglang-python"
    for release in SGLANG_RELEASES:
        env = env_path(release)
        python = env / "bin" / "python"
        if (env / ".complete").exists() and python.exists():
            source = f"cached env sglang {release}"
            return SglangEnv(str(python), source, env), source
    return None, (
        "no complete cached SGLang env (scripts/sglang_envs.py build) and no --sglang-python"
    )


def package_environ(*extra: str | os.PathLike[str]) -> dict[str, str]:
    """The environment of a child that imports the package, then ``extra`` (``SCRIPTS`` for
    one run as ``python -m bench.<program>``).

    The source tree only when the native module is built into it (``make build-dev``);
    otherwise it would shadow the installed wheel, which has the native module.
    """
    source = ROOT / "python"
    has_native = any((source / "sglang_sidecar_overlay").glob("_native*.so"))
    return child_environ(*([source] if has_native else []), *extra)


@contextlib.contextmanager
def installed_package_site() -> Iterator[Path]:
    """A directory holding a copy of the installed package and a dist-info with only its
    plugin entry point: put on an SGLang env's path, it loads the overlay without the env
    itself being modified."""
    import sglang_sidecar_overlay
    from sglang_sidecar_overlay import entry_point

    installed = Path(sglang_sidecar_overlay.__file__).parent
    with tempfile.TemporaryDirectory(prefix="bench-site-") as tmp:
        site = Path(tmp)
        shutil.copytree(installed, site / "sglang_sidecar_overlay")
        dist = site / "sglang_sidecar_overlay-0.0.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {entry_point.DIST_NAME}\nVersion: 0.0.0\n"
        )
        (dist / "entry_points.txt").write_text(
            f"[{entry_point.PLUGIN_GROUP}]\n"
            f"{entry_point.PLUGIN_NAME} = sglang_sidecar_overlay.plugin:load\n"
        )
        yield site


def last_json_line(stdout: str) -> Any:
    """What a child program printed last (one JSON line)."""
    import json

    return json.loads(stdout.strip().splitlines()[-1])


def last_error_line(stderr: str) -> str:
    return (stderr.strip().splitlines() or ["failed"])[-1]


# --- the machine and its processes -------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        # Major and minor only: the rest names the build of one host's kernel.
        "kernel": ".".join(platform.release().split(".")[:2]),
        "python": platform.python_version(),
    }


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM (KiB) and Threads of a process."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            fields[key] = int(value.split()[0])
    return fields


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used."""
    from sglang_sidecar_overlay.sidecar.proctree import read_stat

    stat = read_stat(pid)
    if stat is None:
        raise ProcessLookupError(pid)
    return (stat.utime + stat.stime) / os.sysconf("SC_CLK_TCK")


# --- numbers in the tables ---------------------------------------------------------------------


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "n/a"


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
