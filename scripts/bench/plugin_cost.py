"""Row 5: ``load_plugins()`` in a fresh process with this plugin allowed vs allow-listing nothing.

Each sample is ``python -m bench.plugin_load`` in the SGLang environment given (the row's
parameter: any env with SGLang, stock or rebuilt), with a copy of the installed package on
its path (``common.installed_package_site``), so the env itself is not modified.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

from sglang_sidecar_overlay.entry_point import PLUGIN_NAME, SGLANG_PLUGINS_ENV

from bench.common import (
    SCRIPTS,
    SglangEnv,
    count,
    installed_package_site,
    last_error_line,
    last_json_line,
    median,
    ms,
)

# SGLANG_PLUGINS for each case: the plugin allowed, or an allow-list naming no plugin.
CASES = (("with", PLUGIN_NAME), ("without", "none_but_this"))


def measure(env: SglangEnv | None, runs: int, bare: bool = False) -> dict[str, Any]:
    """``runs`` alternating samples of each case in ``env``; ``bare`` skips the engine
    pre-imports (the smoke pass)."""
    if env is None:
        return {"error": "no Python with SGLang"}
    out: dict[str, Any] = {"with": [], "without": [], "leader_launch": [], "walk": []}
    with installed_package_site() as site:
        path = os.pathsep.join([str(site), str(SCRIPTS)])
        for _ in range(runs):
            for case, allowed in CASES:
                proc = subprocess.run(
                    [env.python, "-m", "bench.plugin_load", *(["--bare"] if bare else [])],
                    capture_output=True,
                    text=True,
                    env={**os.environ, "PYTHONPATH": path, SGLANG_PLUGINS_ENV: allowed},
                )
                if proc.returncode != 0:
                    return {"error": last_error_line(proc.stderr)}
                result = last_json_line(proc.stdout)
                if case == "with" and not result["overlay_modules"]:
                    return {"error": "the plugin was not loaded by load_plugins()"}
                out[case].append(result["load_plugins"])
                out["walk"].append(result["walk"])
                if case == "with":
                    out["leader_launch"].append(result["leader_launch"])
                    out["targets"] = result["targets"]
    return out


def render(results: dict[str, Any]) -> list[str]:
    pc = results["plugin"]
    lines = ["", "## 5. Plugin cost", ""]
    if "error" in pc:
        return [*lines, f"Not measured: {pc['error']}."]
    w, wo = median(pc["with"]), median(pc["without"])
    launch = median(pc["leader_launch"]) if pc.get("leader_launch") else None
    walk = median(pc["walk"]) if pc.get("walk") else None
    targets = pc.get("targets")
    lines += [
        "`load_plugins()` in a fresh process that has already imported the modules an engine "
        "process holds at that point (engine, HTTP server, scheduler, KV events, ...), allowed "
        "to load this plugin (`SGLANG_PLUGINS=sidecar_overlay`) vs allow-listing nothing.",
        "",
        "| case | median ms | max ms |",
        "|---|---:|---:|",
        f"| with the plugin | {ms(w)} | {ms(max(pc['with']))} |",
        f"| without | {ms(wo)} | {ms(max(pc['without']))} |",
        f"| added by the plugin | {ms(w - wo)} | |",
    ]
    if launch is not None:
        lines.append(
            f"| added when a leader's launch starts (native gRPC, no `--sidecar`) "
            f"| {ms(launch)} | {ms(max(pc['leader_launch']))} |"
        )
    if walk is not None:
        lines.append(
            f"| SGLang's walk over the loaded modules, once (paid per hooked target) "
            f"| {ms(walk)} | {ms(max(pc['walk']))} |"
        )
    lines += [
        "",
        "Each hooked target costs a walk: after patching it, SGLang's `HookRegistry` walks every "
        "loaded module to rebind `from … import` copies of it, for methods of classes too, "
        "which no such import can copy. So `load_plugins()` hooks one target in the engine "
        "process and the launch hooks only what the node's role needs (`adapters/_hooks.py`); "
        "the rest is the plugin's own imports (the adapter and its hook list at "
        "`load_plugins()`, the builder when a launch starts) and the installed SGLang's "
        "version, read from its metadata header. The launch row is that second step for a "
        "leader: the overlay's builder imported, the launch's incarnation begun, its hooks "
        "applied.",
    ]
    if walk is not None and targets and launch is not None:
        hooked = targets[0] + (targets[1] or 0)
        added = w - wo + launch
        share = "most" if hooked * walk > added / 2 else "less than half"
        lines += [
            "",
            f"Here `load_plugins()` hooked {count(targets[0], 'target')} and the leader's "
            f"launch {targets[1]} more: {hooked} walks, about {ms(hooked * walk)} of the "
            f"{ms(added)} ms the two steps add ({share} of it).",
        ]
    return lines
