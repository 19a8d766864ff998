"""One column of the seeds' validation table (``make validate``, ``scripts/validate.py``): the
four deployments at the seed's full shapes, each launched, measured as the seed measured it
(``overlay_harness.seed_checks``) and stopped, one after another (``overlay_harness.deployments``
launches them).

Run inside one SGLang env, as ``python -m overlay_harness.validation --column COLUMN --out
FILE [--rows 1,2,3,4] [--consumer VERSION] [--keep-logs DIR]``; the column is what that env and
its environment are:

- ``stock``: the release's own wheel, the plugin not loaded (``SGLANG_OVERLAY_TEST_PLUGINS``
  ``none``): what users run today;
- ``overlay``: the same wheel with the plugin;
- ``rebuilt``: the wheel rebuilt with the patch series, the plugin not loaded.

Requests enter through Dynamo's frontend: the released version's, with its sidecar as every
node's ``--sidecar``, or with ``--consumer`` a next version's (``dynamo.next_consumers``), its
sidecars started beside the nodes. Where a column
fails, the cell says where and with what: a launch that never served names the error its logs
end with, a measure that fell short keeps its counts. Nothing here asserts: the script that
runs the columns compares them with what each column is expected to show.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_sidecar_overlay import releases

from overlay_harness import checks, dynamo, gate, kv_events, nodes, pd, probes, seed_checks
from overlay_harness.deployments import SHAPES, Deployment
from overlay_harness.group import PAGE_SIZE, TINY_MODEL

COLUMNS = ("stock", "overlay", "rebuilt")
# A router that has not seen a target's events in this long will not: the overlay's column
# sees them within seconds, and a failing column must not spend the router's test deadline on
# every pin.
EVENTS_DEADLINE = 45.0
REGISTRATION_DEADLINE = 90.0
# Log lines that say why a launch or a request failed, in the engines', sidecars' and
# frontend's logs.
FAILURE_LINE = re.compile(
    r"error|exception|outside dp_size|conflict|refus|mismatch|does not match", re.IGNORECASE
)
FAILURE_LINES = 3


@dataclasses.dataclass
class Cell:
    """One deployment's measures in one column, as the table prints them."""

    row: int
    column: str
    shape: str
    consumer: str = dynamo.RELEASED.version
    launch: str = "–"
    benchmark: str = "–"
    hit_rate: str = "–"
    targeted: str = "–"
    events: str = "–"
    transfers: str = "–"
    failure: str = ""
    passed: bool = False


def failure_lines(paths: list[Path]) -> str:
    """The last lines of ``paths`` that say what failed, each file's in turn."""
    found = []
    for path in paths:
        with contextlib.suppress(OSError):
            lines = path.read_text(errors="replace").splitlines()
            found += [f"{path.stem}: {line.strip()[:300]}" for line in lines
                      if FAILURE_LINE.search(line)][-FAILURE_LINES:]  # fmt: skip
    return " | ".join(found[-2 * FAILURE_LINES :])


def kind_targets(deployment: Deployment, served: dict) -> tuple[list, list]:
    """(prefill targets, decode targets) of a disaggregated deployment, by the router that
    knows them: one router per kind, and ``served`` (a reply) names a prefill worker."""
    prefill: list = []
    decode: list = []
    for scores in deployment.router.scores_per_router(kv_events.prompt()):
        kind = prefill if served["prefill_worker_id"] in {w for w, _ in scores} else decode
        kind += sorted(scores, key=lambda target: (target[1], target[0]))
    return prefill, decode


def known_targets(router, expected: int) -> list:
    """The targets ``router`` knows once it knows ``expected`` of them, or at the deadline."""
    probe = kv_events.prompt()
    last: list = []

    def complete() -> bool:
        last[:] = list(router.target_scores(probe))
        return len(last) >= expected

    with contextlib.suppress(AssertionError):
        nodes.wait_for(complete, REGISTRATION_DEADLINE, "")
    return sorted(last, key=lambda target: (target[1], target[0]))


def pins_of(deployment: Deployment, targets: list, served: dict | None) -> list[seed_checks.Pin]:
    """One pin per target of an aggregated deployment; on a disaggregated one, the pairs of
    ``seed_checks.pair_pins`` over the targets each kind's router knows."""
    if served is None:
        return seed_checks.aggregated_pins(targets)
    return seed_checks.pair_pins(*kind_targets(deployment, served))


def expected_pins(deployment: Deployment) -> int:
    """How many pins :func:`pins_of` makes when the routers know every target."""
    if not deployment.disaggregated:
        return deployment.targets
    per_kind = range(deployment.targets // 2)
    return len(seed_checks.pair_pins([(0, r) for r in per_kind], [(1, r) for r in per_kind]))


def transferred(deployment: Deployment) -> tuple[int, int]:
    """(bytes, transfers) the metered prefill engines report so far."""
    totals = [0, 0]
    for node in deployment.metered:
        status, text = node.inside(probes.http_text, node.http_port, node.address,
                                   "/metrics")  # fmt: skip
        if status == 200:
            totals = [a + b for a, b in zip(totals, pd.transferred_bytes(text), strict=True)]
    return totals[0], totals[1]


def transfers_cell(deployment: Deployment, sent: list, received: list, moved: tuple[int, int],
                   expected: int) -> tuple[str, bool]:  # fmt: skip
    """The transfers cell: every digest a prefill sent verified by a decode, no mismatch, and
    on metered engines the bytes against the digested pages."""
    mismatches = sum(node.log_text().count("KV checksum mismatch") for node in deployment.decode)
    sent_digests = collections.Counter(digest for digest, _ in sent)
    unverified = sum((sent_digests - collections.Counter(received)).values())
    text = (f"{len(sent)} digests sent, {len(sent) - unverified} verified by a decode, "
            f"{mismatches} mismatches")  # fmt: skip
    ok = (
        unverified == 0 and len(received) == len(sent) and mismatches == 0 and len(sent) >= expected
    )
    if deployment.metered:
        config = json.loads((TINY_MODEL / "config.json").read_text())
        page_bytes = PAGE_SIZE * pd.kv_bytes_per_token(config)
        pages = sum(count for _, count in sent)
        text += f"; {moved[0]:,} B in {moved[1]} transfers, {pages} pages digested"
        # 0.5.21 digests whole prompts, sending only what the decode's cached prefix lacks.
        exact = pd.digests_only_sent_pages()
        bounded = moved[0] == pages * page_bytes if exact else moved[0] <= pages * page_bytes
        ok = ok and bounded and moved[1] == len(sent)
    return text, ok


def measure(deployment: Deployment, cell: Cell) -> None:
    """The seed's measures of a launched deployment into ``cell``."""
    targets = known_targets(deployment.router, deployment.targets)
    deployment.frontend.wait_for_model()
    sent_before = pd.digest_counts(deployment.prefill)
    received_before = pd.digest_counts(deployment.decode)
    moved_before = transferred(deployment)
    # The frontend lists the model before every worker kind can be routed to; the reply names
    # a prefill worker.
    served = seed_checks.first_served(deployment.frontend) if deployment.disaggregated else None
    bench = seed_checks.benchmark(deployment.frontend)
    cell.benchmark = f"{bench.succeeded}/{bench.requests} in {bench.seconds:.0f} s"
    cell.hit_rate = f"{bench.second_pass_hit_rate:.1%}"
    pins = pins_of(deployment, targets, served)
    counts = seed_checks.targeted(deployment.frontend, deployment.router, pins, targets,
                                  events_deadline=EVENTS_DEADLINE)  # fmt: skip
    # Targets the router never knew: their requests are the seed's, and none of them passed.
    per_target = seed_checks.PINNED_PER_TARGET + seed_checks.UNPINNED_PER_TARGET
    missing_pins = max(expected_pins(deployment) - len(pins), 0)
    counts.requests += missing_pins * per_target
    counts.unpinned += missing_pins * seed_checks.UNPINNED_PER_TARGET
    counts.targets = deployment.targets
    if missing_pins:
        counts.failures.insert(0, f"the routers knew {len(targets)} of {deployment.targets} "
                                  f"targets: {targets}")  # fmt: skip
    cell.targeted = (f"{counts.passed}/{counts.requests} ({counts.unpinned_passed}/"
                     f"{counts.unpinned} unpinned)")  # fmt: skip
    cell.events = f"{counts.event_targets}/{counts.targets}"
    passed = (bench.succeeded == bench.requests and counts.passed == counts.requests
              and counts.event_targets == counts.targets)  # fmt: skip
    problems = ([f"benchmark: {bench.first_error}"] if bench.first_error else []) + counts.failures
    if deployment.disaggregated:
        sent = pd.digests_since(deployment.prefill, sent_before)
        received = [digest for digest, _ in pd.digests_since(deployment.decode, received_before)]
        moved = tuple(a - b for a, b in zip(transferred(deployment), moved_before, strict=True))
        cell.transfers, transfers_ok = transfers_cell(
            deployment, sent, received, moved, bench.succeeded + counts.passed)  # fmt: skip
        passed = passed and transfers_ok
    cell.passed = passed
    if problems:
        cell.failure = "; ".join(str(p)[:300] for p in problems[:2])


def run_row(row: int, column: str, workdir: Path, consumer: dynamo.Consumer) -> Cell:
    """Deployment ``row`` launched with ``consumer`` in front, measured and stopped; its
    cell."""
    shape, launcher = SHAPES[row]
    cell = Cell(row, column, shape, consumer.version)
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(gate.large_launch(f"validation row {row}"))
        stage = "launch"
        try:
            deployment = launcher(stack, workdir, consumer)
            cell.launch, stage = deployment.launch, "serving"
            measure(deployment, cell)
            # The KV pools and the allocator grow while serving: the figure a host must hold.
            tagged = [pid for node in deployment.nodes for pid in nodes.pids_with_tag(node.tag)]
            _rss, pss = checks.memory_kib(nodes.pids_of_tree(tagged))
            cell.launch += f"; PSS {pss / 2**20:.2f} GiB after the measures"
        except Exception as error:  # the cell names it: a column may fail anywhere
            message = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
            cell.failure = (f"before serving ({stage}): {type(error).__name__}: {message}"
                            f" | {failure_lines(sorted(workdir.glob('*.log')))}")  # fmt: skip
            if stage == "launch":
                cell.launch = "FAIL before serving"
    return cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--column", choices=COLUMNS, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the cells, as JSON lines")
    parser.add_argument("--rows", default="1,2,3,4")
    parser.add_argument("--keep-logs", type=Path, help="copy each row's logs here")
    parser.add_argument("--consumer", help="a next Dynamo version in front (default: the released)")
    args = parser.parse_args(argv)
    consumer = dynamo.consumer(args.consumer)
    logs_name = args.column if consumer.supervised else f"{args.column}-dynamo-{consumer.version}"
    rows = [int(r) for r in args.rows.split(",")]
    record_rows(rows, lambda row, workdir: run_row(row, args.column, workdir, consumer),
                args.out, args.keep_logs, f"{logs_name}-row", "validation")  # fmt: skip
    return 0


def record_rows(rows: list, run: Callable[[Any, Path], Any], out_path: Path,
                keep_logs: Path | None, logs_prefix: str, what: str) -> None:  # fmt: skip
    """Each of ``rows`` run by ``run(row, workdir)`` in a fresh working directory, one after
    another; its cell (a dataclass) with the release and its seconds appended to ``out_path``
    as a JSON line and echoed on stderr after ``what``, and its logs copied under
    ``keep_logs`` (as ``{logs_prefix}{row}``) when given."""
    release = releases.installed_sglang_version()
    for row in rows:
        with tempfile.TemporaryDirectory(prefix=f"overlay-{what}-{row}-") as tmp:
            started = time.monotonic()
            cell = run(row, Path(tmp))
            if keep_logs is not None:
                shutil.copytree(tmp, keep_logs / f"{logs_prefix}{row}",
                                ignore=shutil.ignore_patterns("home", "discovery-*", "tokenizer"),
                                dirs_exist_ok=True)  # fmt: skip
        record = {**dataclasses.asdict(cell), "release": release,
                  "seconds": round(time.monotonic() - started)}  # fmt: skip
        with out_path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        sys.stderr.write(f"{what}: {json.dumps(record)}\n")


if __name__ == "__main__":
    sys.exit(main())
