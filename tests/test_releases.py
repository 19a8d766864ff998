"""Reading the installed SGLang's version (``releases.installed_sglang_version``).

A real distribution on the path of a fresh interpreter: the lookup goes through
``importlib.metadata`` as it does in an SGLang process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dev_paths import child_environ

READ_VERSION = (
    "from sglang_sidecar_overlay import releases; print(releases.installed_sglang_version())"
)


def _read_version(site: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", READ_VERSION],
        capture_output=True,
        text=True,
        env=child_environ(site, inherit=False),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _install_fake_sglang(site: Path, metadata_name: str, text: str) -> None:
    dist = site / "sglang-0.5.23.dist-info"
    dist.mkdir(parents=True)
    (dist / metadata_name).write_text(text)


@pytest.mark.parametrize("metadata_name", ["METADATA", "PKG-INFO"])
def test_version_is_the_header_field_not_a_line_of_the_description(tmp_path, metadata_name):
    _install_fake_sglang(
        tmp_path,
        metadata_name,
        "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23.post1\nSummary: x\n\n"
        "Version: 9.9.9\nA description line that looks like a header.\n",
    )
    assert _read_version(tmp_path) == "0.5.23.post1"
