"""Row 5: ``load_plugins()`` in a fresh process with this plugin allowed vs allow-listing nothing,
on both sides of the patch series: stock SGLang and the rebuilt wheel (patch 0006's registry).

Each sample is ``python -m bench.plugin_load`` in the SGLang environment of a side, with a
copy of the installed package on its path (``common.installed_package_site``), so the env
itself is not modified: on the rebuilt side the overlay is loaded for the measurement only.
"""

from __future__ import annotations

import subprocess
from typing import Any

from dev_paths import child_environ
from sglang_sidecar_overlay.entry_point import PLUGIN_NAME, SGLANG_PLUGINS_ENV

from bench.common import (
    SCRIPTS,
    SglangEnv,
    installed_package_site,
    last_error_line,
    last_json_line,
    median,
    ms,
)

# SGLANG_PLUGINS for each case: the plugin allowed, or an allow-list naming no plugin.
CASES = (("with", PLUGIN_NAME), ("without", "none_but_this"))
# The goals for the rebuilt side (issue 25): per process, both steps summed; the overlay's own.
GOAL_PER_PROCESS_MS = 26.0
GOAL_OVERLAY_SHARE_MS = 5.0


def rebuilt_env() -> SglangEnv | None:
    """The rebuilt wheel's env (``scripts/patches.py``: built once, then cached), or None
    when it cannot be built here."""
    import patches

    try:
        _, env = patches.patched_env()
    except (SystemExit, OSError, subprocess.CalledProcessError) as exc:
        print(f"   rebuilt side not measured: {exc}", flush=True)
        return None
    return SglangEnv(str(env / "bin" / "python"), "the rebuilt wheel's env")


def measure_side(env: SglangEnv | None, runs: int, bare: bool = False) -> dict[str, Any]:
    """``runs`` alternating samples of each case in ``env``; ``bare`` skips the engine
    pre-imports (the smoke pass)."""
    if env is None:
        return {"error": "no Python with SGLang"}
    out: dict[str, Any] = {"with": [], "without": [], "leader_launch": [], "walk": [],
                           "registry": [], "version": env.version()}  # fmt: skip
    with installed_package_site() as site:
        environ = child_environ(site, SCRIPTS, inherit=False)
        for _ in range(runs):
            for case, allowed in CASES:
                proc = subprocess.run(
                    [env.python, "-m", "bench.plugin_load", *(["--bare"] if bare else [])],
                    capture_output=True,
                    text=True,
                    env={**environ, SGLANG_PLUGINS_ENV: allowed},
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
                    out["registry"].append(result["registry"])
                    out["targets"], out["walks"] = result["targets"], result["walks"]
    return out


def measure(
    env: SglangEnv | None, rebuilt: SglangEnv | None, runs: int, bare: bool = False
) -> dict[str, Any]:
    """Both sides: ``env`` (stock) and ``rebuilt`` (None: that side is reported missing)."""
    sides = {"stock": measure_side(env, runs, bare)}
    sides["rebuilt"] = measure_side(rebuilt, runs, bare) if rebuilt else {"error": "no rebuilt env"}
    return sides


def figures(side: dict[str, Any]) -> dict[str, float]:
    """Medians (s): what each step adds, their sum per process, the registry's walks in them
    and the overlay's own share (the sum without the walks)."""
    added = median(side["with"]) - median(side["without"])
    launch = median(side["leader_launch"])
    registry = median(side["registry"])
    total = added + launch
    return {"added": added, "launch": launch, "total": total, "registry": registry,
            "overlay": total - registry, "walk": median(side["walk"])}  # fmt: skip


def _verdict(value_ms: float, goal_ms: float) -> str:
    return (
        f"{value_ms:.2f} ms, goal ≤ {goal_ms:.0f} ms: {'met' if value_ms <= goal_ms else 'not met'}"
    )


def render(results: dict[str, Any]) -> list[str]:
    sides = results["plugin"]
    lines = ["", "## 5. Plugin cost", ""]
    broken = {name: side["error"] for name, side in sides.items() if "error" in side}
    if "stock" in broken:
        return [*lines, f"Not measured: {broken['stock']}."]
    measured = {name: figures(side) for name, side in sides.items() if name not in broken}
    names = {name: f"{name} {side.get('version')}" for name, side in sides.items()}
    header = " | ".join(names[name] for name in measured)
    lines += [
        "`load_plugins()` in a fresh process that has already imported the modules an engine "
        "process holds at that point (engine, HTTP server, scheduler, KV events, ...), allowed "
        "to load this plugin (`SGLANG_PLUGINS=sidecar_overlay`) vs allow-listing nothing; then "
        "what the overlay's launch step adds on a leader (native gRPC, no `--sidecar`: the "
        "launch's incarnation begun, its hooks applied, the HTTP route rebound; the builder is "
        "imported by the first reply, not here). Both sides run the same plugin; the rebuilt "
        "wheel's `HookRegistry` skips the module walk for targets owned by a class (patch "
        "0006). Medians, ms:",
        "",
        f"| step | {header} |",
        "|---|" + "---:|" * len(measured),
    ]
    rows = (
        ("`load_plugins()`: added by the plugin", "added"),
        ("the leader's launch step", "launch"),
        ("**per process, both steps**", "total"),
        ("of which the registry's walks", "registry"),
        ("**the overlay's own share** (imports and work)", "overlay"),
        ("one walk over the loaded modules", "walk"),
    )
    for label, key in rows:
        lines.append(f"| {label} | " + " | ".join(ms(f[key]) for f in measured.values()) + " |")
    walks = " / ".join(f"{sides[name]['walks']} ({names[name]})" for name in measured)
    lines += ["", f"Walks run by the registry in the two steps: {walks}."]
    if "rebuilt" in measured:
        rebuilt = measured["rebuilt"]
        lines += [
            "",
            "On the rebuilt side: per process "
            f"{_verdict(rebuilt['total'] * 1000, GOAL_PER_PROCESS_MS)}; the overlay's own "
            f"share {_verdict(rebuilt['overlay'] * 1000, GOAL_OVERLAY_SHARE_MS)}. Stock to "
            f"rebuilt, per process: {ms(measured['stock']['total'])} → "
            f"{ms(rebuilt['total'])} ms.",
        ]
    elif "rebuilt" in broken:
        lines += ["", f"The rebuilt side was not measured: {broken['rebuilt']}."]
    return lines
