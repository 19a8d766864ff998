"""Row 6: the shape of our GetServerInfo service, hand-framed vs tonic's generated server.

The same load as row 1, interleaved the same way, against ``ours`` (a tower service handing out
the reply framed once at start-up) and ``ours-generated`` (tonic's generated server returning
the pre-encoded message through a codec: one copy per call).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.common import ratio
from bench.load import interleaved, servers_of_size

SHAPES = ("ours", "ours-generated")


def measure(client: Path, extension: str, args: argparse.Namespace) -> dict[str, Any]:
    points: dict[str, Any] = {}
    for label, size in args.sizes.items():
        with servers_of_size(SHAPES, size, extension) as (servers, expect):
            points.update(interleaved(client, servers, label, expect, args))
    return points


def render(results: dict[str, Any]) -> list[str]:
    points = results.get("service_shape")
    if not points:
        return []
    lines = [
        "",
        "## 6. GetServerInfo service: hand-framed vs tonic-generated",
        "",
        "Ours as shipped (a tower service handing out the reply framed once at start-up) vs "
        "tonic's generated server returning the pre-encoded message through a codec (one copy "
        "per call). Ratios above 1 favour hand framing.",
        "",
        "| snapshot | clients | framed req/s | generated req/s | framed/generated "
        "| p99 ms framed / generated | p99 generated/framed "
        "| CPU µs/req framed / generated | CPU generated/framed |",
        "|---|---:|---:|---:|---:|---|---:|---|---:|",
    ]
    for key, point in points.items():
        label, concurrency = key.split("|")
        f, g = point["ours"], point["ours-generated"]
        lines.append(
            f"| {label} | {concurrency} | {f['rps']:.0f} | {g['rps']:.0f} | "
            f"{ratio(f['rps'], g['rps'])} | {f['p99_us'] / 1000:.2f} / {g['p99_us'] / 1000:.2f} "
            f"| {ratio(g['p99_us'], f['p99_us'])} | {f['cpu_us']:.0f} / {g['cpu_us']:.0f} | "
            f"{ratio(g['cpu_us'], f['cpu_us'])} |"
        )
    return lines
