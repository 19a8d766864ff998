"""Row 8: serving cost on SGLang's real schedulers: one leader node with this plugin allowed
vs stock, launch by launch, and the noise floor of the same measurement with both sides stock.

Each launch is ``python -m bench.serving_launch`` in the SGLang environment (a copy of the
installed package on its path, ``common.installed_package_site``, as row 5), which starts the
node through ``test-registered``'s harness, runs the workload and stops the node; this process
never imports SGLang. One launch runs at a time. A round launches the overlay, stock, and two
more stock nodes for the noise floor, in that order in even rounds and reversed in odd ones, so
each pair's starting side alternates.

Other load on a shared machine moves these figures far more than any hook: each launch reports
how many cores other processes kept busy during its launch and during its workload, and one
above ``FOREIGN_LIMIT`` is run again (at most ``MAX_REPEATS`` times, and at most half as many
repeats as the run has launches); the text under the table says how many were, and which
launches were kept while still disturbed.

Every process of a launch carries a marker in its environment: whatever ends the run (an
error, a deadline, Ctrl-C), the launch program is sent SIGTERM (it stops its node), and
anything still carrying the marker after it is gone gets SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from dev_paths import HARNESS, child_environ
from sglang_sidecar_overlay.sidecar import proctree

from bench.common import (
    ROOT,
    SCRIPTS,
    SglangEnv,
    count,
    installed_package_site,
    last_error_line,
    last_json_line,
    median,
)

REQUESTS = 64
TEST_PLATFORM_DISTRIBUTION = "overlay-cpu-platform"
INPUT_TOKENS, OUTPUT_TOKENS, CONCURRENCY = 128, 32, 4
# A launch's order in even rounds; odd rounds run it reversed. "noise-a" takes the overlay's
# place in its pair and "noise-b" stock's, so both pairs are measured alike.
ORDER = ("overlay", "stock", "noise-a", "noise-b")
PAIRS = {"overlay": ("overlay", "stock"), "noise": ("noise-a", "noise-b")}
# Deadlines (s): one whole launch, the launch program's own stop, leftovers' SIGTERM grace.
LAUNCH_DEADLINE = 600.0
STOP_GRACE = 90.0
LEFTOVER_GRACE = 10.0
MARKER_ENV = "SGLANG_OVERLAY_BENCH_LAUNCH"
# A launch during which other processes kept more cores than this busy on average (its launch
# or its workload) is run again, at most MAX_REPEATS times.
FOREIGN_LIMIT = 0.25
MAX_REPEATS = 2
# Random splits of the stock launches that the noise band is read from.
SPLITS = 2000


class Figure(NamedTuple):
    key: str
    label: str
    unit: str
    higher_is_better: bool = False
    # Compared as a ratio, or (a delay near zero, of either sign) as a difference in ms.
    difference: bool = False
    # The part of a launch whose other load disturbs this figure.
    phase: str = "workload"

    @property
    def heading(self) -> str:
        return f"{self.label} ({self.unit})"


FIGURES = (
    Figure("launch_s", "launch to ready", "s", phase="launch"),
    Figure("launch_cpu_s", "launch CPU, node's processes", "s", phase="launch"),
    Figure("rps", "throughput", "req/s", higher_is_better=True),
    Figure("latency_p50_ms", "latency p50", "ms"),
    Figure("latency_p99_ms", "latency p99", "ms"),
    Figure("ttft_p50_ms", "time to first token p50", "ms"),
    Figure("cpu_ms_per_request", "CPU per request, node's processes", "ms"),
    Figure("kv_delay_p50_ms", "KV event delay p50", "ms", difference=True),
    Figure("kv_delay_p99_ms", "KV event delay p99", "ms", difference=True),
    Figure("rss_mib", "RSS, engine + schedulers", "MiB"),
)


# --- running launches --------------------------------------------------------------------------


def measure(
    env: SglangEnv | None, rounds: int, requests: int, noise: bool = True, repeats: bool = True
) -> dict[str, Any]:
    """``rounds`` rounds of launches (with the noise pair when ``noise``), one at a time;
    with ``repeats``, a launch that other processes disturbed is run again."""
    if env is None:
        return {"error": "no Python with SGLang"}
    if (missing := ensure_test_platform(env)) is not None:
        return {"error": missing}
    order = ORDER if noise else ORDER[:2]
    out: dict[str, Any] = {"version": env.version(), "rounds": rounds, "noise": noise,
                           "workload": {"requests": requests, "input_tokens": INPUT_TOKENS,
                                        "output_tokens": OUTPUT_TOKENS,
                                        "concurrency": CONCURRENCY},
                           "foreign_limit": FOREIGN_LIMIT, "repeats": repeats,
                           "launches": []}  # fmt: skip
    budget = RepeatBudget(rounds * len(order) // 2 if repeats else 0)
    started = time.monotonic()
    with installed_package_site() as site:
        for number in range(rounds):
            for label in order if number % 2 == 0 else reversed(order):
                where = f"round {number + 1}, {label}"
                launch = settled_launch(env, site, label, requests, budget, where)
                if "error" in launch:
                    out["error"] = f"{where}: {launch['error']}"
                    return out
                out["launches"].append({"round": number, "label": label, **launch})
                print(f"   {where}: {_progress(launch)}", flush=True)
    out["seconds"] = time.monotonic() - started
    return out


def ensure_test_platform(env: SglangEnv) -> str | None:
    """The launches run on the CPU test platform (``test-registered/cpu_platform``): a cached
    env gets it when it lacks it, as a test session installs it; a Python named by
    ``--sglang-python`` must have it. None, or why the row cannot run."""
    if env.has_distribution(TEST_PLATFORM_DISTRIBUTION):
        return None
    if env.cached is None:
        return (f"{env.source} lacks the CPU test platform: install test-registered/cpu_platform "
                "into it")  # fmt: skip
    from envs import install_test_platform

    install_test_platform(env.cached)
    return None


@dataclasses.dataclass
class RepeatBudget:
    """Repeats left for the whole run, so a machine that stays busy cannot stretch it far."""

    left: int


def settled_launch(
    env: SglangEnv, site: Path, label: str, requests: int, budget: RepeatBudget, where: str
) -> dict[str, Any]:
    """One launch, run again (up to ``MAX_REPEATS`` times, within the run's budget) while
    other processes kept more than ``FOREIGN_LIMIT`` cores busy during its launch or its
    workload: that load is not the overlay's, and three rounds cannot outvote it."""
    attempts = 0
    while True:
        launch = run_launch(env, site, label, requests)
        attempts += 1
        if "error" in launch:
            return launch
        busy = max(launch["foreign_launch_cores"], launch["foreign_workload_cores"])
        if busy <= FOREIGN_LIMIT or attempts > MAX_REPEATS or budget.left == 0:
            return {**launch, "attempts": attempts}
        budget.left -= 1
        print(f"   {where}: other processes kept {busy:.2f} cores busy; again", flush=True)


def run_launch(env: SglangEnv, site: Path, label: str, requests: int) -> dict[str, Any]:
    """One launch program, to its end; its figures, or ``{"error": ...}``."""
    marker = uuid.uuid4().hex
    side = "overlay" if label == "overlay" else "stock"
    argv = [env.python, "-m", "bench.serving_launch", "--side", side, "--requests", str(requests),
            "--input-tokens", str(INPUT_TOKENS), "--output-tokens", str(OUTPUT_TOKENS),
            "--concurrency", str(CONCURRENCY)]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=launch_environ(env, site, marker),
        cwd=ROOT / "test-registered",
    )
    try:
        stdout, stderr = proc.communicate(timeout=LAUNCH_DEADLINE)
    except subprocess.TimeoutExpired:
        stop_launch(proc)
        return {"error": f"not done within {LAUNCH_DEADLINE:.0f} s"}
    except BaseException:
        stop_launch(proc)
        raise
    finally:
        stop_marked(marker)
    if proc.returncode != 0:
        sys.stderr.write(stderr[-4000:])
        with contextlib.suppress(ValueError, IndexError, KeyError):
            return {"error": last_json_line(stdout)["error"]}
        return {"error": last_error_line(stderr)}
    return figures(last_json_line(stdout))


def launch_environ(env: SglangEnv, site: Path, marker: str) -> dict[str, str]:
    """The launch program's environment: the package copy, the bench package and the harness
    importable; the env's tools on PATH, as if it were activated; the launch's marker."""
    environ = child_environ(site, SCRIPTS, HARNESS, inherit=False)
    environ.pop("VIRTUAL_ENV", None)
    environ["PATH"] = f"{Path(env.python).parent}{os.pathsep}{environ.get('PATH', '')}"
    environ[MARKER_ENV] = marker
    return environ


def stop_launch(proc: subprocess.Popen[str]) -> None:
    """SIGTERM (the launch program stops its node), then SIGKILL past the grace."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def marked(marker: str) -> list[proctree.ProcKey]:
    """Live processes whose environment carries the launch's marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for pid, stat in proctree.process_table().items():
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            if stat.state != "Z" and needle in environ.split(b"\0"):
                found.append((pid, stat.starttime))
    return found


def stop_marked(marker: str) -> None:
    """Whatever of a launch outlived its program: SIGTERM, then SIGKILL past the grace."""
    left = marked(marker)
    if not left:
        return
    print(f"   stopping {len(left)} leftover process(es) of the launch", flush=True)
    proctree.signal_processes(left, signal.SIGTERM)
    deadline = time.monotonic() + LEFTOVER_GRACE
    while (left := [key for key in left if proctree.is_running(key)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    proctree.signal_processes(left, signal.SIGKILL)


# --- figures -----------------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


def figures(launch: dict[str, Any]) -> dict[str, Any]:
    """A launch program's measurements as the table's figures."""
    return {
        "launch_s": launch["launch"],
        "launch_cpu_s": launch["launch_cpu"],
        "rps": launch["rps"],
        "cpu_ms_per_request": launch["cpu_per_request"] * 1000,
        "latency_p50_ms": median(launch["latency"]) * 1000,
        "latency_p99_ms": percentile(launch["latency"], 99) * 1000,
        "ttft_p50_ms": median(launch["ttft"]) * 1000,
        "kv_delay_p50_ms": median(launch["kv_delay"]) * 1000,
        "kv_delay_p99_ms": percentile(launch["kv_delay"], 99) * 1000,
        "rss_mib": sum(launch["rss_kib"].values()) / 1024,
        "rss_engine_mib": launch["rss_kib"]["engine"] / 1024,
        "kv_endpoint_from": launch["kv_endpoint_from"],
        "foreign_launch_cores": launch["foreign_cores"]["launch"],
        "foreign_workload_cores": launch["foreign_cores"]["workload"],
    }


def _progress(launch: dict[str, Any]) -> str:
    return (
        f"{launch['launch_s']:.1f} s to ready, {launch['rps']:.1f} req/s, "
        f"others {launch['foreign_workload_cores']:.2f} cores, "
        f"{launch['cpu_ms_per_request']:.1f} CPU ms/req, "
        f"TTFT p50 {launch['ttft_p50_ms']:.1f} ms, KV delay p50 {launch['kv_delay_p50_ms']:.2f} "
        f"ms, {launch['rss_mib']:.0f} MiB"
    )


def disturbed(row: dict[str, Any], item: dict[str, Any], phase: str) -> bool:
    """Whether other processes kept more than the run's limit busy during that phase."""
    return bool(item[f"foreign_{phase}_cores"] > row["foreign_limit"])


def _values(row: dict[str, Any], label: str, figure: Figure) -> dict[int, float]:
    """Round -> figure of the launches labelled ``label``, but for those disturbed in the
    figure's phase."""
    return {
        item["round"]: item[figure.key]
        for item in row["launches"]
        if item["label"] == label and not disturbed(row, item, figure.phase)
    }


def _compare(a: float, b: float, figure: Figure) -> float | None:
    if figure.difference:
        return a - b
    return a / b if a > 0 and b > 0 else None


class Comparison(NamedTuple):
    first: float | None  # median of the pair's first side (overlay, noise-a)
    second: float | None  # median of its second side (stock, noise-b)
    overall: float | None  # first vs second, of the medians
    rounds: list[float]  # first vs second, round by round


def compare(row: dict[str, Any], pair: str, figure: Figure) -> Comparison:
    """A pair's figure over its undisturbed launches (None where a side has none)."""
    first, second = (_values(row, label, figure) for label in PAIRS[pair])
    per_round = [_compare(first[r], second[r], figure) for r in sorted(first) if r in second]
    a = median(list(first.values())) if first else None
    b = median(list(second.values())) if second else None
    overall = _compare(a, b, figure) if a is not None and b is not None else None
    return Comparison(a, b, overall, [v for v in per_round if v is not None])


# --- the table ---------------------------------------------------------------------------------


def _shown(value: float | None, figure: Figure) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.2f} ms" if figure.difference else f"{value:.2f}×"


def _spread(values: list[float], figure: Figure) -> str:
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    if figure.difference:
        return f"{lo:+.2f} – {hi:+.2f}"
    return f"{lo:.2f}–{hi:.2f}×"


def _number(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def verdict(row: dict[str, Any], overlay: Comparison, figure: Figure) -> str:
    """Within noise, or better/worse than it: the overlay's departure from level against the
    noise band (``noise_band``); ratios compared as logarithms, so 0.5× and 2× are the same
    distance from level."""
    band = noise_band(row, figure)
    if overlay.overall is None or band is None:
        return "n/a"
    departure = _departure(overlay.overall, figure)
    if abs(departure) <= band:
        return "within noise"
    worse = departure < 0 if figure.higher_is_better else departure > 0
    return "**worse than noise**" if worse else "better than noise"


def noise_band(row: dict[str, Any], figure: Figure) -> float | None:
    """How far from level noise alone takes the comparison: the larger of what the noise
    pair showed (its medians or any round) and what 95% of the ways of splitting the run's
    stock launches (stock and both noise sides) into two groups as large as the overlay's
    and stock's give. Launches of one side differ by up to half in throughput even on an idle
    machine (the scheduler's CPU time per request with them), and a few rounds can split
    fast and slow launches unevenly between two sides by chance alone."""
    noise = compare(row, "noise", figure)
    if noise.overall is None:
        return None
    band = max(abs(_departure(v, figure)) for v in [noise.overall, *noise.rounds])
    overlay, stock = (len(_values(row, label, figure)) for label in PAIRS["overlay"])
    pool = [v for label in ("stock", *PAIRS["noise"]) for v in _values(row, label, figure).values()]
    if len(pool) < overlay + stock or not overlay or not stock:
        return band
    shuffled = random.Random(0)
    departures = []
    for _ in range(SPLITS):
        shuffled.shuffle(pool)
        split = _compare(median(pool[:overlay]), median(pool[overlay : overlay + stock]), figure)
        if split is not None:
            departures.append(abs(_departure(split, figure)))
    if departures:
        band = max(band, statistics.quantiles(departures, n=20, method="inclusive")[18])
    return band


def _departure(value: float, figure: Figure) -> float:
    return value if figure.difference else math.log(value)


def render(results: dict[str, Any]) -> list[str]:
    row = results.get("serving")
    if row is None:
        return []
    lines = ["", "## 8. Serving cost on SGLang's real schedulers", ""]
    if "error" in row:
        return [*lines, f"Not measured: {row['error']}."]
    noise = row["noise"]
    lines += [_describe(row), ""]
    header = "| figure | overlay | stock | overlay vs stock | spread (rounds) |"
    rule = "|---|---:|---:|---:|---|"
    if noise:
        header += " noise: stock vs stock | noise spread | verdict |"
        rule += "---:|---|---|"
    lines += [header, rule]
    worse: list[str] = []
    unjudged: list[str] = []
    for figure in FIGURES:
        ours = compare(row, "overlay", figure)
        cells = [figure.heading, _number(ours.first), _number(ours.second),
                 _shown(ours.overall, figure), _spread(ours.rounds, figure)]  # fmt: skip
        if noise:
            floor = compare(row, "noise", figure)
            judged = verdict(row, ours, figure)
            if ours.first is not None and ours.second is not None and "noise" in judged:
                # A ratio that rounds to 1.00× can still be outside a tight noise floor.
                change = f"{ours.first - ours.second:+.1f} {figure.unit}"
                if judged != "within noise":
                    judged += f" ({change})"
                if "worse" in judged:
                    worse.append(f"{figure.label} ({change})")
            if judged == "n/a":
                unjudged.append(figure.label)
            cells += [_shown(floor.overall, figure), _spread(floor.rounds, figure), judged]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", _others(row), "", _summary(worse, unjudged, noise)]
    return lines


def _others(row: dict[str, Any]) -> str:
    """What other processes did to the machine meanwhile, which launches were repeated and
    which figures were left out."""
    launches = row["launches"]
    workload = [item["foreign_workload_cores"] for item in launches]
    during = [item["foreign_launch_cores"] for item in launches]
    repeated = sum(item["attempts"] - 1 for item in launches)
    left_out = [
        f"{item['label']} of round {item['round'] + 1} ({phase})"
        for item in launches
        for phase in ("launch", "workload")
        if disturbed(row, item, phase)
    ]
    text = (
        "Other processes on this machine kept, on average, "
        f"{median(during):.2f} cores busy during a launch (at most {max(during):.2f}) and "
        f"{median(workload):.2f} during a workload (at most {max(workload):.2f}). A launch "
        f"during whose launch or workload they kept more than {row['foreign_limit']:g} cores busy "
    )
    phases = "(the launch figures: its launch; the rest: its workload)"
    if row["repeats"]:
        text += (
            f"was run again (at most {MAX_REPEATS} times, within a budget per run; "
            f"{count(repeated, 'repeat')} in this run); if still so, its figures of that phase "
            f"are left out of the comparisons {phases}"
        )
    else:
        text += f"has its figures of that phase left out of the comparisons {phases}"
    return text + (f": here {', '.join(left_out)}." if left_out else ": none here.")


def _describe(row: dict[str, Any]) -> str:
    work = row["workload"]
    noise = (
        " The noise floor is the same measurement with both sides stock (two more stock "
        "launches per round, interleaved the same way): what this machine's noise alone "
        "does to each comparison."
        if row["noise"]
        else " No noise floor in this run."
    )
    verdict = (
        " Verdict: within noise while the overlay's departure from level (ratios as "
        "logarithms) is no larger than the noise pair's (its medians' or any round's), or "
        "than what 95% of random splits of the run's stock launches (stock and both noise "
        "sides) into two groups as large as the two sides' give."
        if row["noise"]
        else ""
    )
    return (
        f"One leader node of SGLang {row['version']} launched through SGLang's own launch "
        "path with its real schedulers on the CPU test platform (the tiny config-only Qwen3 "
        "model, dummy weights, one node, a ZMQ KV-event publisher), with this plugin allowed "
        "(`SGLANG_PLUGINS=sidecar_overlay`) vs stock (`SGLANG_PLUGINS=none`), the same "
        "launch otherwise, `--grpc-port` included on both sides; the CPU platform is "
        f"selected by `SGLANG_PLATFORM` on both sides. {row['rounds']} round(s), one launch "
        "at a time, the starting side alternating. "
        f"Per launch: process start to SGLang's ready callback (after its warm-up request); "
        f"then {work['requests']} streamed `POST /generate` requests, {work['input_tokens']} "
        f"tokens in and {work['output_tokens']} out (`ignore_eos`), {work['concurrency']} at a "
        "time; the KV event delay is from a request's first streamed token to the arrival of "
        "the event batch storing its prompt's first page, at a SUB socket on the endpoint "
        "the overlay advertises (GetServerInfo's `kv_event_sources`; stock: "
        "the launch's own endpoint), negative when the batch comes first; CPU is user + system "
        "time of the node's processes (the engine and every process under it), to ready and "
        "over the workload; RSS is the engine process and its scheduler(s) once the workload "
        "has run. Medians over rounds; "
        "overlay vs stock is the ratio of the medians (the KV delays, near zero and of either "
        "sign: their difference in ms), spread its range over the rounds." + noise + verdict
    )


def _summary(worse: list[str], unjudged: list[str], noise: bool) -> str:
    if not noise:
        return "Without a noise floor, these ratios say only that every launch served."
    text = f"**Worse than noise:** {', '.join(worse)}." if worse else ""
    if unjudged:
        text += f" Not judged (no undisturbed launch on a side): {', '.join(unjudged)}."
    elif not worse:
        text = "**Every figure is within noise**: the overlay costs nothing measurable here."
    return text.strip()
