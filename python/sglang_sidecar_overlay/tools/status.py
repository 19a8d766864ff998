"""``status``: would SGLang load the overlay if it started now, in this Python environment?

Read without importing SGLang: the installed SGLang and the adapter for it, the plugin entry
point and ``SGLANG_PLUGINS``, the native module, the legacy dp_size switch. ``collect_status``
is the ``status --json`` object; ``StatusReport`` carries it as the tools' one report type.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Mapping
from importlib import metadata
from typing import Any, TextIO

from sglang_sidecar_overlay import __version__
from sglang_sidecar_overlay.entry_point import PLUGIN_GROUP, PLUGIN_NAME, SGLANG_PLUGINS_ENV
from sglang_sidecar_overlay.tools.report import Line, Report, print_lines

__all__ = ["LEGACY_SHAPE", "StatusReport", "collect_status", "plugin_allowed", "run_status"]


# What a node with the dp_size switch on serves, for status.
LEGACY_SHAPE = (
    "dp_size = the KV-publisher ranks, attn_dp_size = 1: registered exactly by Dynamo <= 1.6.1 "
    "(dp_rank < dp_size) and >= 1.7 (dp_rank < dp_size * attn_dp_size)"
)


def plugin_allowed(environ: Mapping[str, str]) -> bool:
    """Whether SGLang's ``SGLANG_PLUGINS`` allow-list lets the overlay load.

    SGLang treats an unset or empty value as "load every plugin"; otherwise only the
    comma-separated, whitespace-stripped names listed are loaded.
    """
    raw = environ.get(SGLANG_PLUGINS_ENV)
    if not raw:
        return True
    allowed = {name.strip() for name in raw.split(",") if name.strip()}
    return PLUGIN_NAME in allowed


def _entry_point() -> metadata.EntryPoint | None:
    for entry in metadata.entry_points(group=PLUGIN_GROUP):
        if entry.name == PLUGIN_NAME:
            return entry
    return None


def _module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _native_status() -> dict[str, Any]:
    try:
        from sglang_sidecar_overlay import _native
    except ImportError as exc:
        return {"importable": False, "version": None, "build": None, "error": str(exc)}
    build = dict(_native.build_info()) if hasattr(_native, "build_info") else None
    version = getattr(_native, "__version__", None)
    return {"importable": True, "version": version, "build": build, "error": None}


def collect_status(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``status --json`` object: what SGLang would do with the overlay on this machine."""
    env = os.environ if environ is None else environ
    reasons: list[str] = []
    sglang = _sglang_status(reasons)
    plugin = _plugin_status(env, reasons)
    native = _native_status()
    if not native["importable"]:
        reasons.append(f"native module does not import: {native['error']}")
    legacy = _legacy_status(env, reasons)
    return {
        "active": not reasons,
        "reasons": reasons,
        "overlay_version": __version__,
        "sglang": sglang,
        "plugin": plugin,
        "native": native,
        "legacy_dp_size": legacy,
    }


def _sglang_status(reasons: list[str]) -> dict[str, Any]:
    """The installed SGLang and the adapter that applies; what stops the overlay, in ``reasons``."""
    from sglang_sidecar_overlay import releases

    version = releases.installed_sglang_version()
    adapter = releases.adapter_for(version) if version else None
    adapter_present = adapter is not None and _module_present(adapter)
    if version is None:
        reasons.append("SGLang is not installed in this Python environment")
    elif adapter is None:
        reasons.append(
            f"SGLang {version} is not supported (supported: {releases.SUPPORTED_RANGE}); "
            "the plugin logs a warning and installs nothing"
        )
    elif not adapter_present:
        reasons.append(f"adapter module {adapter} is missing from this install")
    return {
        "installed": version is not None,
        "version": version,
        "supported": adapter is not None,
        "supported_range": releases.SUPPORTED_RANGE,
        "supported_versions": list(releases.SUPPORTED_VERSIONS),
        "adapter": adapter,
        "adapter_present": adapter_present,
    }


def _plugin_status(env: Mapping[str, str], reasons: list[str]) -> dict[str, Any]:
    """The entry point SGLang finds the overlay by, and whether ``SGLANG_PLUGINS`` allows it."""
    entry = _entry_point()
    plugin_module: str | None = None
    if entry is None:
        reasons.append(
            f"entry point {PLUGIN_GROUP}:{PLUGIN_NAME} is not visible "
            "(the wheel is not installed in this environment)"
        )
    else:
        plugin_module = entry.value.split(":", 1)[0].strip()
        if not _module_present(plugin_module):
            reasons.append(f"entry point target module {plugin_module} is missing")
    allowed = plugin_allowed(env)
    if not allowed:
        reasons.append(
            f"{SGLANG_PLUGINS_ENV}={env.get(SGLANG_PLUGINS_ENV)!r} does not list {PLUGIN_NAME}"
        )
    return {
        "group": PLUGIN_GROUP,
        "name": PLUGIN_NAME,
        "entry_point_visible": entry is not None,
        "entry_point": None if entry is None else entry.value,
        "module_present": plugin_module is not None and _module_present(plugin_module),
        "sglang_plugins": env.get(SGLANG_PLUGINS_ENV),
        "allowed": allowed,
    }


def _legacy_status(env: Mapping[str, str], reasons: list[str]) -> dict[str, Any]:
    """The legacy dp_size switch: as set, or (unset) what a launch would decide."""
    from sglang_sidecar_overlay.contract.legacy_dp_size import (
        DP_SIZE_CHECKING_SIDECARS,
        LEGACY_DP_SIZE_ENV,
        consumer_version,
        legacy_dp_size_enabled,
    )

    legacy: dict[str, Any] = {"env": LEGACY_DP_SIZE_ENV, "value": env.get(LEGACY_DP_SIZE_ENV)}
    # What a launch decides: as set, or (unset) on for a --sidecar that checks rank widths.
    legacy["default_on_for"] = {}
    for sidecar in sorted(DP_SIZE_CHECKING_SIDECARS):
        distribution, installed = consumer_version(sidecar) or (None, None)
        legacy["default_on_for"][sidecar] = {"distribution": distribution, "version": installed}
    legacy["shape"] = LEGACY_SHAPE
    try:
        legacy["enabled"] = legacy_dp_size_enabled(env)
        legacy["error"] = None
    except ValueError as exc:
        legacy["enabled"] = False
        legacy["error"] = str(exc)
        reasons.append(str(exc))
    return legacy


def _status_lines(status: Mapping[str, Any]) -> list[Line]:
    sglang = status["sglang"]
    plugin = status["plugin"]
    native = status["native"]
    legacy = status["legacy_dp_size"]
    lines: list[Line] = []
    if not sglang["installed"]:
        lines.append(("error", "SGLang", "not installed"))
    else:
        level = "ok" if sglang["supported"] else "error"
        support = "supported" if sglang["supported"] else "NOT supported"
        lines.append(
            (level, "SGLang", f"{sglang['version']} ({support}; {sglang['supported_range']})")
        )
    if sglang["adapter"]:
        level = "ok" if sglang["adapter_present"] else "error"
        lines.append((level, "adapter", sglang["adapter"]))
    else:
        lines.append(("info", "adapter", "none applies"))
    if plugin["entry_point_visible"]:
        text = f"{plugin['group']}: {plugin['name']} = {plugin['entry_point']}"
        if not plugin["module_present"]:
            text += " (module missing)"
        lines.append(("ok" if plugin["module_present"] else "error", "plugin entry point", text))
    else:
        lines.append(("error", "plugin entry point", f"{plugin['group']}:{plugin['name']} absent"))
    if plugin["sglang_plugins"]:
        level = "ok" if plugin["allowed"] else "error"
        verdict = "lists" if plugin["allowed"] else "excludes"
        text = f"{plugin['sglang_plugins']!r} {verdict} {plugin['name']}"
        lines.append((level, SGLANG_PLUGINS_ENV, text))
    else:
        lines.append(("ok", SGLANG_PLUGINS_ENV, "unset (every installed plugin loads)"))
    if native["importable"]:
        build = native["build"] or {}
        extra = ", ".join(str(build[key]) for key in ("profile", "target") if build.get(key))
        lines.append(("ok", "native module", f"{native['version']} ({extra})"))
    else:
        lines.append(("error", "native module", native["error"]))
    if legacy["error"]:
        lines.append(("error", "legacy dp_size", legacy["error"]))
    elif legacy["value"] is not None:
        state = "on" if legacy["enabled"] else "off"
        lines.append(("info", "legacy dp_size", f"{state} ({legacy['env']}={legacy['value']!r})"))
    else:
        consumers = ", ".join(
            f"{sidecar} ({found['distribution']} {found['version'] or 'not installed'})"
            for sidecar, found in legacy["default_on_for"].items()
        )
        text = f"unset ({legacy['env']}): on for --sidecar {consumers}, off for any other"
        lines.append(("info", "legacy dp_size", text))
    lines.append(("info", "legacy dp_size on", legacy["shape"]))
    return lines


@dataclasses.dataclass
class StatusReport(Report):
    """The ``status`` report: active or not, with the reasons."""

    status: dict[str, Any]

    @property
    def ok(self) -> bool:
        """SGLang would load the overlay's hooks."""
        return bool(self.status["active"])

    def to_json(self) -> dict[str, Any]:
        """The stable ``status --json`` object (documented in the operator guide)."""
        return self.status

    def render(self, out: TextIO) -> None:
        print(f"sglang-sidecar-overlay {self.status['overlay_version']}", file=out)
        print_lines(_status_lines(self.status), out)
        if self.ok:
            print("active: SGLang will load the overlay's hooks at startup", file=out)
        for reason in self.status["reasons"]:
            print(f"inactive: {reason}", file=out)


def run_status(environ: Mapping[str, str] | None = None) -> StatusReport:
    """``status``: the overlay's state in this environment (``os.environ`` when not given)."""
    return StatusReport(collect_status(environ))
