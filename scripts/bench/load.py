"""Rows 1 and 2: GetServerInfo throughput and latency under load, and each server's memory.

One measurement gives both: the servers of one snapshot size run side by side, each round
visits them in turn (so whatever else the machine does hits all of them alike), and each
server process's memory is read idle before the load and again after the 1 MiB runs.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import proc_status, ratio
from bench.servers import (
    ServerProcess,
    check_bytes,
    encoded_response,
    run_load,
    server_process,
    snapshot,
)

SIZES = {"20 KB": 20 * 1024, "1 MiB": 1024 * 1024}
CONCURRENCY = (1, 16, 64)
SERVERS = ("ours", "upstream", "grpcio")
_FIGURES = ("rps", "p50_us", "p99_us", "mean_us", "cpu_us", "client_cpu_us")


def parse_sizes(text: str) -> dict[str, int]:
    """``--sizes``: labels of :data:`SIZES`, comma-separated; an unknown one is an error."""
    labels = [label.strip() for label in text.split(",") if label.strip()]
    unknown = [label for label in labels if label not in SIZES]
    if unknown or not labels:
        raise SystemExit(f"--sizes {text!r}: expected labels among {', '.join(SIZES)}")
    return {label: SIZES[label] for label in labels}


def parse_clients(text: str) -> tuple[int, ...]:
    """``--clients``: positive counts, comma-separated."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise SystemExit(f"--clients {text!r}: expected positive integers, comma-separated")
    return counts


def point_key(label: str, concurrency: int) -> str:
    return f"{label}|{concurrency}"


def median_run(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in _FIGURES}


def print_point(label: str, concurrency: int, point: dict[str, Any]) -> None:
    cells = "  ".join(
        f"{k}={v['rps']:8.0f}/s p50={v['p50_us'] / 1000:6.2f}ms p99={v['p99_us'] / 1000:6.2f}ms"
        for k, v in point.items()
    )
    print(f"  {label:>6} c={concurrency:<3} {cells}", flush=True)


def interleaved(
    client: Path,
    servers: dict[str, ServerProcess],
    label: str,
    expect: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Every concurrency of ``args``: ``args.rounds`` rounds, each visiting every server, the
    starting server rotating; the median run per server and point."""
    kinds = tuple(servers)
    points: dict[str, Any] = {}
    for concurrency in args.concurrency:
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                runs[kind].append(run_load(client, servers[kind], concurrency, args, expect))
        points[point_key(label, concurrency)] = {k: median_run(v) for k, v in runs.items()}
        print_point(label, concurrency, points[point_key(label, concurrency)])
    return points


@contextlib.contextmanager
def servers_of_size(
    kinds: tuple[str, ...], size: int, extension: str, settle: float = 0.0
) -> Iterator[tuple[dict[str, ServerProcess], int]]:
    """Every server of ``kinds`` serving a ``size``-byte snapshot, each checked to answer with
    exactly it after ``settle`` seconds; and the bytes of the reply the load client expects."""
    json_info = snapshot(size)
    with contextlib.ExitStack() as stack:
        servers = {k: stack.enter_context(server_process(k, size, extension)) for k in kinds}
        time.sleep(settle)
        for server in servers.values():
            check_bytes(server.port, json_info)
        yield servers, len(encoded_response(json_info))


def measure(client: Path, extension: str, args: argparse.Namespace) -> dict[str, Any]:
    """Rows 1 and 2. Servers of one size run side by side; each round visits them in turn."""
    points: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    for label, size in args.sizes.items():
        # Settled first: the idle memory is read a second after the servers started.
        with servers_of_size(SERVERS, size, extension, settle=1.0) as (servers, expect):
            if label == "20 KB":
                for kind, server in servers.items():
                    memory[kind] = {"before": server.before, "idle": proc_status(server.pid)}
            points.update(interleaved(client, servers, label, expect, args))
            if label == "1 MiB":
                for kind, server in servers.items():
                    memory.setdefault(kind, {})["after_1mib_load"] = proc_status(server.pid)
    return {"points": points, "memory": memory}


def render(results: dict[str, Any]) -> list[str]:
    lines = [
        "## 1. GetServerInfo throughput and latency (loopback)",
        "",
        "| snapshot | clients | ours req/s | upstream req/s | grpcio req/s | ours/upstream "
        "| ours/grpcio | p50 ms ours / upstream / grpcio | p99 ms ours / upstream / grpcio "
        "| p99 upstream/ours | server CPU µs/req ours / upstream / grpcio "
        "| client CPU µs/req ours / upstream / grpcio |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---|---|",
    ]
    for key, point in results["throughput"]["points"].items():
        size, conc = key.split("|")
        o, u, g = point["ours"], point["upstream"], point["grpcio"]
        lines.append(
            f"| {size} | {conc} | {o['rps']:.0f} | {u['rps']:.0f} | {g['rps']:.0f} "
            f"| {ratio(o['rps'], u['rps'])} | {ratio(o['rps'], g['rps'])} "
            f"| {o['p50_us'] / 1000:.2f} / {u['p50_us'] / 1000:.2f} / {g['p50_us'] / 1000:.2f} "
            f"| {o['p99_us'] / 1000:.2f} / {u['p99_us'] / 1000:.2f} / {g['p99_us'] / 1000:.2f} "
            f"| {ratio(u['p99_us'], o['p99_us'])} "
            f"| {o['cpu_us']:.0f} / {u['cpu_us']:.0f} / {g['cpu_us']:.0f} "
            f"| {_client_cpu(o)} / {_client_cpu(u)} / {_client_cpu(g)} |"
        )
    lines += [
        "",
        "Server CPU µs/req is the server process's CPU time (user + system) during the run "
        "divided by the requests it served: it moves less than req/s when other work shares "
        "the machine. Client CPU µs/req is the load client's, the same way: client and server "
        "share the two cores, so a server whose replies cost the client more gets fewer of "
        "them.",
    ]
    memory = results["throughput"]["memory"]
    # Idle memory is read at the 20 KB servers: a run of other sizes has no row 2.
    return lines + (_render_memory(memory) if all("idle" in m for m in memory.values()) else [])


def _client_cpu(figures: dict[str, float]) -> str:
    # Results recorded before the client's CPU was measured lack it.
    return f"{figures['client_cpu_us']:.0f}" if "client_cpu_us" in figures else "–"


def _render_memory(mem: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## 2. Idle resident memory and threads of a running server process",
        "",
        'RSS is the whole process (interpreter included); "added" is the growth from before the '
        'module import to 1 s after the server started, idle. "After 1 MiB load" is the RSS '
        "once the 1 MiB rows above finished.",
        "",
        "| server | idle RSS MiB | added by server MiB | threads (added) "
        "| RSS after 1 MiB load MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind in SERVERS:
        b, i = mem[kind]["before"], mem[kind]["idle"]
        after = mem[kind].get("after_1mib_load", {}).get("VmRSS", 0)
        lines.append(
            f"| {kind} | {i['VmRSS'] / 1024:.1f} | {(i['VmRSS'] - b['VmRSS']) / 1024:.1f} "
            f"| {i['Threads']} ({i['Threads'] - b['Threads']:+d}) | {after / 1024:.1f} |"
        )
    return lines
