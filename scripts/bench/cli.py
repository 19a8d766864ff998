"""``python scripts/benchmark.py``: which rows run, with which settings, and where the results
go."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import bench
from bench import (
    leader_info,
    load,
    plugin_cost,
    report,
    service_shape,
    serving,
    sidecar,
    startup,
)
from bench.common import ROOT, SglangEnv, find_sglang_env, machine
from bench.servers import build_client, upstream_grpc_extension


def build_parser() -> argparse.ArgumentParser:
    description = (bench.__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python scripts/benchmark.py", description=description)
    parser.add_argument("--quick", action="store_true", help="short runs")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every row once with tiny durations, nothing written; exit 1 if a row failed",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=2.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--client-threads", type=int, default=1)
    parser.add_argument(
        "--load-client",
        choices=("h2", "tonic"),
        default="h2",
        help="how the load client reads replies: counted frame by frame (h2), or gathered whole "
        "by tonic (default: %(default)s)",
    )
    parser.add_argument("--startup-runs", type=int, default=10)
    parser.add_argument("--sidecar-runs", type=int, default=20)
    parser.add_argument("--sidecar-stop-runs", type=int, default=5)
    parser.add_argument("--sidecar-shutdown-timeout", type=float, default=2.0)
    parser.add_argument("--plugin-runs", type=int, default=9)
    parser.add_argument("--sglang-python", help="Python with SGLang installed (rows 4, 5, 7, 8)")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmark-results.md")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--load", action="store_true", help="run only rows 1 and 2 and print them (no write)"
    )
    parser.add_argument(
        "--sizes",
        default=",".join(load.SIZES),
        help="snapshot sizes of rows 1, 2 and 6, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--clients",
        default=",".join(map(str, load.CONCURRENCY)),
        help="concurrent clients of rows 1 and 6, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--service-shape", action="store_true", help="run only row 6 and print it (no write)"
    )
    parser.add_argument(
        "--plugin-cost", action="store_true", help="run only row 5 and print it (no write)"
    )
    parser.add_argument(
        "--leader-info", action="store_true", help="run only row 7 and print it (no write)"
    )
    parser.add_argument("--leader-calls", type=int, default=200, help="calls per round, row 7")
    parser.add_argument(
        "--serving", action="store_true", help="run only row 8 and print it (no write)"
    )
    parser.add_argument("--serving-rounds", type=int, default=3, help="rounds of launches, row 8")
    parser.add_argument(
        "--serving-requests", type=int, default=serving.REQUESTS, help="requests per launch, row 8"
    )
    return parser


def settings(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with ``--quick`` and ``--smoke`` applied."""
    args = build_parser().parse_args(argv)
    args.concurrency = load.parse_clients(args.clients)
    args.sizes = load.parse_sizes(args.sizes)
    args.serving_noise = True
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 0.5, 0.2
        args.startup_runs, args.sidecar_runs, args.sidecar_stop_runs = 3, 3, 1
        args.plugin_runs, args.serving_rounds = 1, 1
    if args.smoke:
        args.rounds, args.duration, args.warmup = 1, 0.2, 0.05
        args.startup_runs, args.sidecar_runs, args.sidecar_stop_runs = 1, 1, 1
        args.sidecar_shutdown_timeout, args.concurrency = 0.5, (1,)
        args.plugin_runs, args.leader_calls, args.no_write = 1, 20, True
        # One launch per side, a few requests, no noise pair: it proves the row runs.
        args.serving_rounds, args.serving_requests, args.serving_noise = 1, 8, False
    return args


def public_argv(argv: list[str]) -> list[str]:
    """The command line as recorded in the results: the SGLang Python is named, not located."""
    out, hide = [], False
    for arg in argv:
        if hide:
            out.append("<python-with-sglang>")
            hide = False
        elif arg == "--sglang-python":
            out.append(arg)
            hide = True
        elif arg.startswith("--sglang-python="):
            out.append("--sglang-python=<python-with-sglang>")
        else:
            out.append(arg)
    return out


def measure_serving(env: SglangEnv | None, args: argparse.Namespace) -> dict[str, Any]:
    # The smoke pass proves the row runs: a launch disturbed by other load is not run again.
    return serving.measure(
        env, args.serving_rounds, args.serving_requests, args.serving_noise, repeats=not args.smoke
    )


def _one_row(args: argparse.Namespace) -> bool:
    """Run the single row asked for, print it; False when every row is to run."""
    if args.leader_info or args.plugin_cost or args.serving:
        env, source = find_sglang_env(args.sglang_python)
        described = env.describe() if env else source
        if args.serving:
            print(f"8. serving cost ({described})", flush=True)
            row = {"serving": measure_serving(env, args)}
            print("\n".join(serving.render(row)))
            if args.smoke and failed_rows(row):
                raise SystemExit(f"benchmark smoke: row 8 failed: {row['serving']['error']}")
        elif args.leader_info:
            print(f"7. leader GetServerInfo ({described})", flush=True)
            row = {"leader_info": leader_info.measure(env, args.leader_calls)}
            print("\n".join(leader_info.render(row)))
        else:
            print(f"5. plugin cost ({described}, and the rebuilt wheel)", flush=True)
            rebuilt = plugin_cost.rebuilt_env()
            row = {"plugin": plugin_cost.measure(env, rebuilt, args.plugin_runs)}
            print("\n".join(plugin_cost.render(row)))
        return True
    if args.load:
        title = "1-2. GetServerInfo load (ours / upstream / grpcio), memory"
        _print_load_row(title, load, "throughput", args)
        return True
    if args.service_shape:
        title = "6. hand-framed vs generated GetServerInfo service"
        _print_load_row(title, service_shape, "service_shape", args)
        return True
    return False


def _print_load_row(title: str, row: Any, key: str, args: argparse.Namespace) -> None:
    """Runs a row measured with the load client (``load`` or ``service_shape``), its results
    under ``key`` as the full run keeps them, and prints it."""
    extension, client = str(upstream_grpc_extension()), build_client()
    print(title, flush=True)
    print("\n".join(row.render({key: row.measure(client, extension, args)})))


def run_rows(args: argparse.Namespace, env: SglangEnv | None, source: str) -> dict[str, Any]:
    """Every row, in order; rows 4, 5, 7 and 8 run in ``env``."""
    extension, client = str(upstream_grpc_extension()), build_client()
    results: dict[str, Any] = {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "args": {k: v for k, v in vars(args).items() if k not in ("output", "sglang_python")},
        "sglang_python_source": source,
    }
    print("1-2. GetServerInfo load (ours / upstream / grpcio), memory", flush=True)
    results["throughput"] = load.measure(client, extension, args)
    print("3. start to first GetServerInfo", flush=True)
    results["startup"] = startup.measure(extension, args.startup_runs)
    print(f"4. sidecar supervisor (upstream side: {source})", flush=True)
    results["sidecar"] = sidecar.measure(env, args)
    print("5. plugin cost", flush=True)
    rebuilt = plugin_cost.rebuilt_env()
    results["plugin"] = plugin_cost.measure(env, rebuilt, args.plugin_runs, bare=args.smoke)
    print("6. hand-framed vs generated GetServerInfo service", flush=True)
    results["service_shape"] = service_shape.measure(client, extension, args)
    print("7. leader GetServerInfo, rebuilt per call vs cached", flush=True)
    results["leader_info"] = leader_info.measure(env, args.leader_calls)
    print("8. serving cost, overlay vs stock on SGLang's real schedulers", flush=True)
    results["serving"] = measure_serving(env, args)
    return results


def failed_rows(results: dict[str, Any]) -> list[str]:
    """The rows whose results hold an ``error`` anywhere."""

    def has_error(value: Any) -> bool:
        if isinstance(value, dict):
            return "error" in value or any(has_error(item) for item in value.values())
        if isinstance(value, list):
            return any(has_error(item) for item in value)
        return False

    return [row for row, value in results.items() if row != "args" and has_error(value)]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = settings(argv)
    command = "python scripts/benchmark.py " + " ".join(shlex.quote(a) for a in public_argv(argv))
    # The package is the installed wheel (make benchmark installs it), never the source tree.
    if _one_row(args):
        return
    env, source = find_sglang_env(args.sglang_python)
    if env is not None:
        source = env.describe()
    results = run_rows(args, env, source)
    text = report.render(results, command.strip())
    print(text.split("\n## Raw results")[0])
    if args.smoke:
        failed = failed_rows(results)
        if failed:
            raise SystemExit(f"benchmark smoke: rows failed: {failed}")
        print("benchmark smoke: every row ran")
    elif not args.no_write:
        args.output.write_text(text)
        print(f"wrote {args.output.relative_to(ROOT)}")
