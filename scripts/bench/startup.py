"""Row 3: time from a server's start call to the first GetServerInfo it answers.

Each sample is a fresh process (``python -m bench.first_call``), and the servers take turns.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from bench.common import SCRIPTS, median, ms, package_environ, ratio
from bench.load import SERVERS


def measure(extension: str, runs: int) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {k: [] for k in SERVERS}
    env = package_environ(SCRIPTS)
    for _ in range(runs):
        for kind in SERVERS:
            proc = subprocess.run(
                [sys.executable, "-m", "bench.first_call", kind, extension],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            out[kind].append(json.loads(proc.stdout))
    return out


def render(results: dict[str, Any]) -> list[str]:
    st = results["startup"]
    lines = [
        "",
        "## 3. Start call to first answered GetServerInfo",
        "",
        "A fresh process per sample; the grpcio client is imported and its channel created "
        'before the clock starts. "client floor" is the same client\'s first call on a fresh '
        "channel to an already running server: the part of the figure that is not the server's.",
        "",
        "| server | median ms | max ms | client floor median ms | vs ours |",
        "|---|---:|---:|---:|---:|",
    ]
    ours_first = median([s["first"] for s in st["ours"]])
    for kind in SERVERS:
        first = [s["first"] for s in st[kind]]
        floor = [s["client_floor"] for s in st[kind]]
        lines.append(
            f"| {kind} | {ms(median(first))} | {ms(max(first))} "
            f"| {ms(median(floor))} | {ratio(median(first), ours_first)} |"
        )
    return lines
