"""A steady load through Dynamo's frontend while a fault happens, and what it measured.

The load has the seed's request shape (128 prompt tokens, 64 generated, 4 at a time, as
``seed_checks.benchmark``), each prompt new (random token ids: no prompt shares a page with
another). It runs on the frontend's host (``steady_completions``, through
``inside.Stream``), keeps ``concurrency`` requests in flight from :meth:`Load.start` until
:meth:`Load.finish`, and reports every request as it ends: when it was sent and when it ended
(this machine's monotonic clock, which every namespace shares), where the frontend routed it,
or its error. A request that gets no answer within its bound (``HANG_BOUND``) ends as hung:
the client gives up there, so a hang is counted, never waited out.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import random
import sys
import threading
import time
import urllib.error

from overlay_harness import inside, probes
from overlay_harness.nodes import wait_for

INPUT_TOKENS = 128
OUTPUT_TOKENS = 64
CONCURRENCY = 4
# A request of the seed's shape takes about 4 s on the 2-core machine, and a migrated one
# starts again: anything past this bound is a request that would have hung.
HANG_BOUND = 90.0
HUNG = "hung"
FIRST_TOKEN, VOCAB = 3, 512


def random_prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN, VOCAB) for _ in range(length)]


def one_completion(port: int, host: str, model: str, prompt: list[int], bound: float) -> dict:
    """One completion of the load, timed: ``sent``/``ended`` (monotonic), and its routing
    (``worker``, ``rank``) or its ``error`` (``HUNG`` when unanswered within ``bound``)."""
    body = {"model": model, "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "nvext": {"extra_fields": ["worker_id"]}}  # fmt: skip
    record: dict = {"sent": time.monotonic()}
    try:
        answer = probes.post_json(f"http://{host}:{port}/v1/completions", body, bound)
        routed = (answer.get("nvext") or {}).get("worker_id") or {}
        tokens = (answer.get("usage") or {}).get("completion_tokens")
        record.update(worker=routed.get("prefill_worker_id"), rank=routed.get("prefill_dp_rank"))
        if tokens != OUTPUT_TOKENS:
            record["error"] = f"{tokens} of {OUTPUT_TOKENS} tokens"
    except urllib.error.HTTPError as exc:
        record["error"] = f"{exc.code} {exc.read()[:300].decode(errors='replace')}"
    except TimeoutError:
        record["error"] = HUNG
    except OSError as exc:
        timed_out = "timed out" in str(exc)
        record["error"] = HUNG if timed_out else f"{type(exc).__name__}: {exc}"
    record["ended"] = time.monotonic()
    return record


def steady_completions(port: int, host: str, model: str, concurrency: int, bound: float,
                       seed: int):  # fmt: skip
    """Run on the frontend's host: ``concurrency`` clients, each sending one new prompt after
    another until this process's stdin closes; yields each request's record as it ends, then
    ``{"end": requests}`` once the last one in flight has ended."""
    stop = threading.Event()
    ended: queue.Queue = queue.Queue()

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while not stop.is_set():
            prompt = random_prompt(rng, INPUT_TOKENS)
            ended.put(one_completion(port, host, model, prompt, bound))
        ended.put(None)

    def until_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    clients = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in clients:
        thread.start()
    running, count = concurrency, 0
    while running:
        record = ended.get()
        if record is None:
            running -= 1
            continue
        count += 1
        yield record
    yield {"end": count}


@dataclasses.dataclass
class Measured:
    """Every request of one load, in the order they ended."""

    records: list[dict]
    bound: float

    @property
    def sent(self) -> int:
        return len(self.records)

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.records if "error" in r]

    @property
    def succeeded(self) -> int:
        return self.sent - len(self.failed)

    @property
    def hung(self) -> int:
        return sum(r.get("error") == HUNG for r in self.records)

    @property
    def first_error(self) -> str | None:
        failed = sorted(self.failed, key=lambda r: r["ended"])
        return failed[0]["error"] if failed else None

    def first_served_after(self, moment: float, workers: set | None = None) -> float | None:
        """Seconds from ``moment`` to the end of the first request sent after it and served
        (by one of ``workers`` when given); None when none was."""
        ends = [r["ended"] for r in self.records if "error" not in r and r["sent"] >= moment
                and (workers is None or r.get("worker") in workers)]  # fmt: skip
        return min(ends) - moment if ends else None

    def token_rate(self, begin: float, end: float) -> float:
        """Generated tokens per second within [begin, end), each served request's tokens
        spread evenly over its life (so a window is not judged by which requests happened to
        end inside it)."""
        tokens = 0.0
        for record in self.records:
            if "error" in record:
                continue
            life = max(record["ended"] - record["sent"], 1e-9)
            overlap = min(record["ended"], end) - max(record["sent"], begin)
            tokens += OUTPUT_TOKENS * max(overlap, 0.0) / life
        return tokens / (end - begin)

    def summary(self) -> str:
        return (f"{self.sent} sent, {self.succeeded} served, {len(self.failed)} failed "
                f"({self.hung} hung past {self.bound:.0f} s), "
                f"first error: {self.first_error}")  # fmt: skip


class Load:
    """The steady load on ``frontend``'s host, from construction until :meth:`finish`."""

    def __init__(self, frontend, *, concurrency: int = CONCURRENCY, bound: float = HANG_BOUND):
        self.bound = bound
        self.started = time.monotonic()
        self.records: list[dict] = []
        self.finished = threading.Event()
        self.stream = inside.Stream(frontend.host, steady_completions, frontend.port,
                                    frontend.address, frontend.model, concurrency, bound,
                                    random.randrange(1 << 30))  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.stream.proc.stdout:
            item = json.loads(line).get("item")
            if item is None or "end" in item:
                break
            self.records.append(item)
        self.finished.set()

    def served_since(self, moment: float) -> int:
        return sum("error" not in r and r["sent"] >= moment for r in list(self.records))

    def wait_served(self, count: int, deadline: float, since: float = 0.0) -> None:
        """Until ``count`` requests sent after ``since`` were served; raises past
        ``deadline`` seconds."""

        def enough() -> bool:
            if self.finished.is_set():
                raise AssertionError(f"the load ended: {self.measured().summary()}")
            return self.served_since(since) >= count

        wait_for(enough, deadline, f"{count} requests served ({self.measured().summary()})")

    def measured(self) -> Measured:
        return Measured(list(self.records), self.bound)

    def stop_sending(self) -> None:
        """No new request from now on; those in flight go on to their end."""
        self.stream.end_input()

    def finish(self) -> Measured:
        """Stop sending; wait for every request in flight to end (each within the bound)."""
        self.stop_sending()
        if not self.finished.wait(self.bound + 30):
            raise AssertionError(f"the load did not end within {self.bound + 30:.0f} s")
        self.stream.close()
        return self.measured()

    def close(self) -> None:
        self.stream.close()
