"""``docs/benchmark-results.md``: every row's table, the conclusions the figures support, and
the raw results.

The conclusions are generated from the figures of the same run, so they cannot disagree with
the tables above them: each names the figures it rests on and says what they show, and an
explanation (such as Nagle's algorithm meeting delayed ACKs) is given only where the figures
show its signature.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from bench import leader_info, load, plugin_cost, service_shape, serving, sidecar, startup
from bench.common import median, ms
from bench.servers import GRPCIO_WORKERS, UPSTREAM_RELEASE

# The delayed-ACK signature: a median call this slow with one client (Linux delays an ACK
# up to 40 ms) while ours, on the same loopback, answers in well under a millisecond.
_DELAYED_ACK_MS = 30.0
# "Level with": a ratio this close to 1 is within what this machine's noise moves.
_LEVEL = 1.5
# The project's throughput goal over a Python grpcio server.
_GOAL_OVER_GRPCIO = 5.0


def render(results: dict[str, Any], command: str) -> str:
    lines = _header(results, command)
    lines += load.render(results)
    lines += startup.render(results)
    lines += sidecar.render(results)
    lines += plugin_cost.render(results)
    lines += service_shape.render(results)
    lines += leader_info.render(results)
    lines += serving.render(results)
    lines += conclusions(results)
    lines += ["", "## Raw results", "", "```json", json.dumps(results, indent=1), "```", ""]
    return "\n".join(lines)


def _header(results: dict[str, Any], command: str) -> list[str]:
    m, args = results["machine"], results["args"]
    return [
        "# Benchmark results",
        "",
        "Produced by the benchmark command (not part of the test run):",
        "",
        f"    {command}",
        "",
        f"Machine: {m['cores']} cores, {m['cpu']}, Linux {m['kernel']}, Python {m['python']}. "
        f"Run at {results['date']}. Load generator: `rust/bench-client` "
        f"({args['client_threads']} client thread(s), one HTTP/2 connection per "
        f"client, {_client_reads(args)}, {args['duration']} s measured after "
        f"{args['warmup']} s warm-up, median of {args['rounds']} interleaved rounds). Client "
        "and server share the same cores, so absolute figures understate a dedicated server; "
        "the ratios are the result.",
        "",
        f"Upstream: `start_metadata_server` from the sglang {UPSTREAM_RELEASE} wheel's `_grpc` "
        "extension. grpcio: a Python `grpc.server` with a generic handler returning the "
        f"pre-encoded response ({GRPCIO_WORKERS} worker threads).",
        "",
    ]


def _client_reads(args: dict[str, Any]) -> str:
    # Results recorded before --load-client existed were read by tonic.
    if args.get("load_client", "tonic") == "tonic":
        return "each reply gathered whole by tonic"
    return "each reply counted frame by frame on `h2`, never held whole"


# --- conclusions -------------------------------------------------------------------------------


def conclusions(results: dict[str, Any]) -> list[str]:
    points = results["throughput"]["points"]
    found = [
        _low_concurrency_floor(points),
        _large_snapshots(points),
        _one_client(points),
        _startup_floor(results["startup"]),
    ]
    bullets = [f"- {text}" for text in found if text]
    return ["", "## Reading the results", "", *bullets] if bullets else []


def _figure(points: dict[str, Any], size: str, clients: int, server: str, key: str) -> float:
    return points[load.point_key(size, clients)][server][key]


def _over(points: dict[str, Any], size: str, clients: int, base: str, key: str = "rps") -> float:
    """ours ÷ ``base`` for ``key`` at one load point."""
    return _figure(points, size, clients, "ours", key) / _figure(points, size, clients, base, key)


def _clients(points: dict[str, Any], size: str) -> list[int]:
    return sorted(int(key.split("|")[1]) for key in points if key.startswith(f"{size}|"))


def _low_concurrency_floor(points: dict[str, Any]) -> str | None:
    if load.point_key("20 KB", 1) not in points:
        return None
    upstream = _figure(points, "20 KB", 1, "upstream", "p50_us") / 1000
    ours = _figure(points, "20 KB", 1, "ours", "p50_us") / 1000
    if upstream < _DELAYED_ACK_MS:
        return (
            f"**No delayed-ACK floor in this run:** with one client at 20 KB upstream's median "
            f"call took {upstream:.1f} ms, ours {ours:.2f} ms."
        )
    text = (
        f"**Upstream's ~{upstream:.0f} ms floor at low concurrency.** With one client at 20 KB "
        f"its median call took {upstream:.1f} ms, ours {ours:.2f} ms. That is the signature of "
        "a server that does not set TCP_NODELAY on accepted connections: a response that ends "
        "in a small HTTP/2 frame (the trailers) waits for the client's delayed ACK (Linux: up "
        "to 40 ms). Ours sets TCP_NODELAY."
    )
    most = _clients(points, "20 KB")[-1]
    if most > 1:
        text += (
            f" With {most} clients the pipelined traffic hides the wait: ours/upstream falls "
            f"from {_over(points, '20 KB', 1, 'upstream'):.1f}× to "
            f"{_over(points, '20 KB', most, 'upstream'):.1f}×."
        )
    return text


def _large_snapshots(points: dict[str, Any]) -> str | None:
    big = _clients(points, "1 MiB")
    if not big:
        return None
    over_grpcio = [_over(points, "1 MiB", c, "grpcio") for c in big]
    lo, hi = min(over_grpcio), max(over_grpcio)
    least_cpu = all(
        _figure(points, "1 MiB", c, "ours", "cpu_us")
        <= min(_figure(points, "1 MiB", c, other, "cpu_us") for other in ("upstream", "grpcio"))
        for c in big
    )
    level = hi <= _LEVEL
    span = f"{lo:.2f}×" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}×"
    text = (
        f"**1 MiB snapshots: ours/grpcio {span} req/s.** "
        + (
            "About level: at 1 MiB every request copies a megabyte through HTTP/2 framing "
            "and loopback TCP on both ends, on cores the client shares, so moving bytes, not "
            "the server's language, bounds all three servers."
            if level
            else "Ours stays ahead even where moving the bytes dominates."
        )
        + (
            " Ours frames the reply once at start-up and hands out the same bytes: the least "
            "server CPU per request at every 1 MiB point."
            if least_cpu
            else " Its server CPU per request was not the lowest at every 1 MiB point."
        )
    )
    return text + "".join(_trailing(points, c) for c in big)


def _trailing(points: dict[str, Any], clients: int) -> str:
    """Where ours trails a peer at 1 MiB: whose CPU each reply cost, the server's or the
    client's (they share the cores)."""
    behind = [p for p in ("grpcio", "upstream") if _over(points, "1 MiB", clients, p) < 1]
    if not behind:
        return ""
    figure = functools.partial(_figure, points, "1 MiB", clients)
    point = points[load.point_key("1 MiB", clients)]
    if not all("client_cpu_us" in point[kind] for kind in load.SERVERS):
        return f" At {clients} clients ours trailed {' and '.join(behind)}."
    cells = "; ".join(
        f"{kind} {figure(kind, 'cpu_us'):.0f} µs server + {figure(kind, 'client_cpu_us'):.0f} µs "
        "client"
        for kind in ("ours", *behind)
    )
    return (
        f" At {clients} clients ours trailed {' and '.join(behind)} (CPU per reply: {cells}). "
        "The load client has one thread: when replies arrive on many connections at once it "
        "interleaves them, and each costs it more than the same reply trickling in from a "
        "slower server."
    )


def _one_client(points: dict[str, Any]) -> str | None:
    small = _clients(points, "20 KB")
    if not small:
        return None
    met = [c for c in small if _over(points, "20 KB", c, "grpcio") >= _GOAL_OVER_GRPCIO]
    ratios = ", ".join(f"{_over(points, '20 KB', c, 'grpcio'):.1f}× with {c}" for c in small)
    goal = (
        f"the ≥ {_GOAL_OVER_GRPCIO:g}× goal over grpcio is met with "
        + ", ".join(str(c) for c in met)
        + " client(s)"
        if met
        else f"the ≥ {_GOAL_OVER_GRPCIO:g}× goal over grpcio is not met at any point of this run"
    )
    text = f"**20 KB, ours/grpcio req/s:** {ratios}; {goal}."
    if 1 in small and 1 not in met:
        text += (
            " A single closed-loop client waits for each reply, so its own round trip bounds "
            "every server at one client."
        )
    return text


def _startup_floor(startup_results: dict[str, Any]) -> str | None:
    ours = startup_results.get("ours")
    if not ours:
        return None
    first = median([s["first"] for s in ours])
    floor = median([s["client_floor"] for s in ours])
    return (
        f"**Start-up:** ours answered its first call {ms(first)} ms after the start call "
        f"(median); {ms(floor)} ms of that is the grpcio client's own first-call cost (the "
        "client floor column), the remainder is the server's."
    )
