"""Row 4: the sidecar supervisor vs SGLang's ``Sidecar``/``SubprocessWatchdog``.

Each measurement is ``scripts/bench_sidecar.py`` in a process of its own, ours (this Python)
then upstream's (the SGLang environment's Python), kind by kind.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

from bench_sidecar import KINDS, LABELS

from bench.common import (
    ROOT,
    SCRIPTS,
    SglangEnv,
    last_json_line,
    median,
    ms,
    package_environ,
    ratio,
)

SCRIPT = SCRIPTS / "bench_sidecar.py"


def measure(env: SglangEnv | None, args: argparse.Namespace) -> dict[str, Any]:
    """Every kind for ours and upstream's; without ``env`` upstream's is not measured.

    The smoke pass runs every kind of ours in one process and only upstream's spawn: each
    upstream sidecar is a spawned child that imports SGLang (seconds apiece), and the spawn
    measurement already drives upstream's start and stop.
    """
    results: dict[str, Any] = {"ours": {}, "upstream": {}}
    plan: list[tuple[str | None, tuple[str, ...]]] = (
        [(None, ("ours",)), ("spawn", ("upstream",))]
        if args.smoke
        else [(kind, ("ours", "upstream")) for kind in KINDS]
    )
    for kind, impls in plan:
        runs = args.sidecar_stop_runs if kind and kind.startswith("stop") else args.sidecar_runs
        for impl in impls:
            python = sys.executable if impl == "ours" else (env.python if env else None)
            if python is None:
                continue
            proc = subprocess.run(
                [
                    python,
                    str(SCRIPT),
                    "--impl",
                    impl,
                    *(["--only", kind] if kind else []),
                    "--json",
                    "--runs",
                    str(runs),
                    "--stop-runs",
                    str(runs),
                    "--shutdown-timeout",
                    str(args.sidecar_shutdown_timeout),
                ],
                capture_output=True,
                text=True,
                # The provider fixtures the sidecar children run are tests/sidecar_providers.
                env=package_environ(ROOT / "tests"),
            )
            if proc.returncode != 0:
                results[impl][kind or "all"] = {"error": proc.stderr.strip().splitlines()[-1:]}
                continue
            measured = last_json_line(proc.stdout)
            results[impl].update({kind: measured[kind]} if kind else measured)
        print(f"  sidecar {kind or 'every kind'} ({', '.join(impls)}): done", flush=True)
    return results


def render(results: dict[str, Any]) -> list[str]:
    sc = results["sidecar"]
    timeout = results["args"]["sidecar_shutdown_timeout"]
    lines = [
        "",
        "## 4. Sidecar supervisor vs SGLang's launcher and SubprocessWatchdog",
        "",
        f"Upstream side: {results['sglang_python_source']}. Same provider children "
        "(`tests/sidecar_providers`) for both; stop of the SIGTERM-ignoring child uses a "
        f"{timeout:g} s shutdown timeout for both.",
        "",
        "| measurement | ours median ms | ours max ms | upstream median ms | upstream max ms "
        "| upstream/ours (median) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind in KINDS:
        ours, up = sc["ours"].get(kind), sc["upstream"].get(kind)
        cells = [*_cells(ours), *_cells(up)]
        both = isinstance(ours, list) and isinstance(up, list) and ours and up
        shown = ratio(median(up), median(ours)) if both else "n/a"
        lines.append(f"| {LABELS[kind].format(t=timeout)} | {' | '.join(cells)} | {shown} |")
    return lines


def _cells(values: Any) -> list[str]:
    if isinstance(values, list) and values:
        return [ms(median(values)), ms(max(values))]
    if isinstance(values, dict):
        return [f"error: {' '.join(values['error'])}", ""]
    return ["not measured", ""]
