"""``entry_point``: the names SGLang finds the overlay by are those ``pyproject.toml`` declares."""

from __future__ import annotations

import re

from conftest import ROOT
from sglang_sidecar_overlay import entry_point


def test_pyproject_declares_the_plugin_under_the_names_the_package_uses() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(rf'^name = "{re.escape(entry_point.DIST_NAME)}"$', text, re.M)
    group = re.search(
        rf'^\[project\.entry-points\."{re.escape(entry_point.PLUGIN_GROUP)}"\]\n(.*)$', text, re.M
    )
    assert group is not None, f"no entry-point group {entry_point.PLUGIN_GROUP}"
    assert group.group(1) == f'{entry_point.PLUGIN_NAME} = "sglang_sidecar_overlay.plugin:load"'
