"""The hostile-input table: this project's metadata server next to upstream SGLang's, one run.

    python scripts/hostile.py [--only PATTERN ...] [--soak-calls N] [--no-write]

Runs every hostile pattern of ``scripts/testkit/hostile_patterns.py`` (the same code the test
suite runs) against ``_native.start_metadata_server`` with its default limits and against
upstream's ``start_metadata_server`` (the ``_grpc`` extension of the newest release's sglang
wheel, loaded the way ``scripts/benchmark.py`` loads it), each pattern on a fresh server
process, while a well-behaved client on an established connection polls GetServerInfo. Then a
soak from ``rust/bench-client``.
Prints the table and writes ``docs/hostile-input.md`` with the command and the machine.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import machine
from bench.servers import UPSTREAM_RELEASE, upstream_grpc_extension
from testkit import hostile_patterns as hp

ROOT = Path(__file__).resolve().parent.parent

SERVERS = ("ours", "upstream")
SNAPSHOT_BYTES = 4096
SOAK_CLIENTS = 64


def _shared(load: tuple[float, float]) -> str:
    # Above one runnable process on average, something besides this run held a core.
    return " (other work shared the machine)" if max(load) > 1.0 else ""


def run_all(
    patterns: list[str], extension: str, soak_calls: int, soak_calls_upstream: int
) -> dict[str, Any]:
    runs: dict[str, dict[str, hp.Run]] = {}
    for name in patterns:
        runs[name] = {}
        for kind in SERVERS:
            with hp.server_process(kind, SNAPSHOT_BYTES, extension) as server:
                run = hp.run_pattern(server, name, min_legit_calls=200)
            runs[name][kind] = run
            print(
                f"  {name:<18} {kind:<8} {run.outcome.status:<60} "
                f"peak +{run.peak_delta_mib:.1f} MiB, legit p99 {_ms(run.legit_p99_ms)}, "
                f"{len(run.legit_errors)} errors",
                flush=True,
            )
    soaks: dict[str, dict[str, Any]] = {}
    for kind, calls in (("ours", soak_calls), ("upstream", soak_calls_upstream)):
        if not calls:
            continue
        with hp.server_process(kind, SNAPSHOT_BYTES, extension) as server:
            soaks[kind] = hp.soak(server, hp.snapshot(SNAPSHOT_BYTES), SOAK_CLIENTS, calls)
            soaks[kind]["alive"] = server.alive()
        print(f"  soak {kind}: {_soak_line(soaks[kind])}", flush=True)
    return {"runs": runs, "soaks": soaks}


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def _soak_line(s: dict[str, Any]) -> str:
    return (
        f"{s['requests']:,} calls, {s['errors']} errors, {s['rps']:,.0f} req/s, "
        f"p99 {s['p99_us'] / 1000:.1f} ms, RSS first quarter {s['first_quarter_kib'] / 1024:.1f} "
        f"MiB, last quarter {s['last_quarter_kib'] / 1024:.1f} MiB ({s['growth']:+.1%})"
    )


def _cell(run: hp.Run) -> list[str]:
    if not run.alive:
        return ["**server died**", "n/a", "n/a"]
    errors = f", {len(run.legit_errors)} failed" if run.legit_errors else ""
    return [
        run.outcome.status,
        f"{run.peak_delta_mib:+.1f} / {run.after_delta_mib:+.1f}",
        f"{_ms(run.legit_p99_ms)} ({run.legit_calls} calls{errors})",
    ]


def render(results: dict[str, Any], command: str) -> str:
    m = machine()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = results["load"]
    lines = [
        "# Hostile input: this project's metadata server and upstream's, side by side",
        "",
        "Produced by the hostile-input command (not part of the test run):",
        "",
        f"    {command}",
        "",
        f"Machine: {m['cores']} cores, {m['cpu']}, Linux {m['kernel']}, Python {m['python']}. "
        f"Run at {stamp}; 1-minute load average {load[0]:.1f} at the start and "
        f"{load[1]:.1f} at the end{_shared(load)}.",
        "",
        "Servers: ours is `_native.start_metadata_server` with its default limits "
        "(see [security.md](security.md)); upstream is `start_metadata_server` from the "
        f"sglang {UPSTREAM_RELEASE} wheel's `_grpc` extension. Each pattern runs against "
        f"a fresh server process serving a {SNAPSHOT_BYTES:,}-byte snapshot. The patterns are "
        "`scripts/testkit/hostile_patterns.py`, the code `tests/native/test_hostile_input.py` runs "
        "against ours.",
        "",
        "- **status**: what the server did to the hostile client (HTTP/2 frames it sent back, "
        "`closed` when it closed the connection; GOAWAY codes: 1 PROTOCOL_ERROR, 6 "
        "FRAME_SIZE_ERROR, 9 COMPRESSION_ERROR, 11 ENHANCE_YOUR_CALM).",
        "- **RSS Δ MiB**: the server process's resident memory, peak during the pattern "
        "(VmHWM after resetting it) / once the pattern ended, minus idle before it.",
        "- **legit p99**: a well-behaved grpcio client on a connection opened before the "
        "pattern, calling GetServerInfo every 10 ms during the pattern and after it until 200 "
        "calls; p99 of its call latency (client and server share the machine's cores, so read "
        "it against the other server's, not as an absolute).",
        "",
        "| pattern | ours: status | ours: RSS Δ MiB peak / after | ours: legit p99 | "
        "upstream: status | upstream: RSS Δ MiB peak / after | upstream: legit p99 |",
        "|---|---|---:|---|---|---:|---|",
    ]
    for name, by_kind in results["runs"].items():
        label = hp.PATTERNS[name][0]
        cells = [*_cell(by_kind["ours"]), *_cell(by_kind["upstream"])]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    soaks = results["soaks"]
    if soaks:
        lines += [
            "",
            "## Soak",
            "",
            f"{SOAK_CLIENTS} clients from `rust/bench-client`, each on its own HTTP/2 "
            "connection, calling GetServerInfo back to back; the server's RSS sampled every "
            "50 ms, first and last quarter of the samples compared. Upstream gets fewer calls "
            "per client because it answers about ten times slower "
            "([benchmark-results.md](benchmark-results.md)).",
            "",
            "| server | calls per client | result |",
            "|---|---:|---|",
        ]
        for kind, s in soaks.items():
            lines.append(f"| {kind} | {s['requests'] // SOAK_CLIENTS:,} | {_soak_line(s)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(hp.PATTERNS), default=None)
    parser.add_argument("--soak-calls", type=int, default=20_000, help="per client, ours")
    parser.add_argument(
        "--soak-calls-upstream", type=int, default=1_000, help="per client, upstream (0: skip)"
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    extension = str(upstream_grpc_extension())
    patterns = args.only or list(hp.PATTERNS)
    load_start = os.getloadavg()[0]
    results = run_all(patterns, extension, args.soak_calls, args.soak_calls_upstream)
    results["load"] = (load_start, os.getloadavg()[0])
    command = "python scripts/hostile.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    text = render(results, command.strip())
    print(text)
    if not args.no_write:
        (ROOT / "docs" / "hostile-input.md").write_text(text)


if __name__ == "__main__":
    main()
