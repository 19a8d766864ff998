"""The seed deployment report's measurements, taken the way users' requests come: through
Dynamo's OpenAI frontend (KV router mode) in front of a launched deployment, with Dynamo's
standalone router beside it as the oracle of what the events told a router (the srt-slurm
report in ``../shared/seeds``; ``docs/validation.md``).

The report measured each deployment the same way, and so does this module:

- **benchmark**: 40 requests of 128 input tokens and 64 output tokens, 4 at a time (SA-Bench's
  shape); a request succeeds when it returns its 64 tokens. The same 40 prompts again (one
  output token each: the prompt's cache hits do not depend on it) give the prefix-cache hit
  rate (SGLang's cached tokens over prompt tokens of that second pass): a figure, compared
  with the stock column, not asserted;
- **targeted**: per (worker, DP rank) target, two requests pinned to it (the second must be
  served from its cache), then seven unpinned repeats, each of which must be routed to the
  target that holds its prefix and served with SGLang's cached tokens at least the input less
  one page. Four targets make the seed's 36 requests, 28 of them unpinned cache checks. These
  generate a few tokens each: routing and the cache are what they check;
- **events**: the router's overlap scores show each target's pinned prompt on that target and
  nowhere else: its ``BlockStored`` events reached the router.

On a disaggregated deployment the targets are the prefill's and the decode's (worker, DP rank)
pairs, scored by one router per kind (``dynamo.PrefillDecodeRouters``); each (prefill, decode)
pair is pinned in turn (``disaggregated_pins``), and the unpinned repeats must find the prefill
target that holds their prefix: that is where a KV router's choice saves the work.

What a deployment's test asserts is the counts (``Measured.assert_seed_pass``); the figures go
to stderr as a row of the validation table (``report``). ``make test`` asserts the overlay's
column, the newest release with the plugin (``benchmark_asserted_here``), and runs the
40-request benchmark there on deployment 2 alone, the two-node attention-DP group the overlay
exists for (``measure(..., with_benchmark=True)``); every deployment takes the targeted and
event measures. The benchmark of every deployment, in every column and at the seed's full
shapes, is ``make validate``'s, which asserts the overlay's and the rebuilt wheel's cells.
"""

from __future__ import annotations

import dataclasses
import sys
import time

from sglang_sidecar_overlay import releases

from overlay_harness import differences, dynamo, kv_events, nodes
from overlay_harness.group import PAGE_SIZE

BENCHMARK_REQUESTS = 40
INPUT_TOKENS = 128
OUTPUT_TOKENS = 64
CONCURRENCY = 4
PINNED_PER_TARGET = 2
UNPINNED_PER_TARGET = 7
TARGETED_OUTPUT_TOKENS = 4


@dataclasses.dataclass(frozen=True)
class Benchmark:
    succeeded: int
    requests: int
    seconds: float
    second_pass_hit_rate: float
    first_error: str | None


@dataclasses.dataclass
class Targeted:
    passed: int = 0
    requests: int = 0
    unpinned_passed: int = 0
    unpinned: int = 0
    event_targets: int = 0
    targets: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Measured:
    deployment: str
    benchmark: Benchmark | None
    targeted: Targeted

    def assert_seed_pass(self) -> None:
        """Every benchmark request, every targeted request and every target's events."""
        bench, targeted = self.benchmark, self.targeted
        problems = []
        if bench is not None and bench.succeeded != bench.requests:
            problems.append(f"benchmark {bench.succeeded}/{bench.requests}: {bench.first_error}")
        if targeted.passed != targeted.requests:
            problems.append(f"targeted {targeted.passed}/{targeted.requests}")
        if targeted.event_targets != targeted.targets:
            problems.append(f"event targets {targeted.event_targets}/{targeted.targets}")
        if problems:
            raise AssertionError("; ".join(problems + targeted.failures[:6]))

    def report(self) -> None:
        """The deployment's row of the validation table, on stderr."""
        bench, targeted = self.benchmark, self.targeted
        release = releases.installed_sglang_version() or ""
        benchmark = (
            f"benchmark {bench.succeeded}/{bench.requests} in {bench.seconds:.1f} s, "
            f"second-pass hit rate {bench.second_pass_hit_rate:.1%}"
            if bench is not None
            else "benchmark: the newest release's session runs it"
        )
        sys.stderr.write(
            f"[{release}] seed table: {self.deployment} | {benchmark} | targeted "
            f"{targeted.passed}/{targeted.requests} ({targeted.unpinned_passed}/"
            f"{targeted.unpinned} unpinned cache checks) | event targets "
            f"{targeted.event_targets}/{targeted.targets}\n"
        )


Target = tuple[int, int]  # (Dynamo worker id, DP rank)


@dataclasses.dataclass(frozen=True)
class Pin:
    """One target's targeted requests: the ``target`` whose cache the unpinned repeats must
    find (a prefill target on a disaggregated deployment), the ``holders`` the pinned
    requests are routed to and whose events must then show the prompt (the target, and on a
    disaggregated deployment the decode target too), and the frontend's ``nvext`` fields
    that pin them there."""

    target: Target
    holders: tuple[Target, ...]
    nvext: dict


def aggregated_pins(targets: list[Target]) -> list[Pin]:
    """One pin per target of an aggregated deployment."""
    return [Pin(target, (target,), dynamo.pin(target)) for target in targets]


def disaggregated_pins(prefill: list[Target], decode: list[Target]) -> list[Pin]:
    """One pin per (prefill target, decode target) pair: every target of both kinds is pinned,
    and the repeats check the prefill side, where a KV router's choice saves the work."""
    return [Pin(p, (p, d), dynamo.pin_disaggregated(p, d)) for p in prefill for d in decode]


def covering_pins(prefill: list[Target], decode: list[Target]) -> list[Pin]:
    """As few (prefill target, decode target) pairs as pin every target of both kinds at least
    once, each kind's targets in turn: the seed's four pins on two prefill and two decode
    engines of two DP ranks each."""
    if not prefill or not decode:
        return []
    pairs = [(prefill[i % len(prefill)], decode[i % len(decode)])
             for i in range(max(len(prefill), len(decode)))]  # fmt: skip
    return [Pin(p, (p, d), dynamo.pin_disaggregated(p, d)) for p, d in pairs]


def pair_pins(prefill: list[Target], decode: list[Target]) -> list[Pin]:
    """Every (prefill, decode) pair while there are no more pairs than targets (a prefill and a
    decode engine of two ranks: 4 pins, the seed's 36 requests); beyond that, as few pairs as
    pin every target (two engines of each kind: 4 pins again)."""
    if len(prefill) * len(decode) <= len(prefill) + len(decode):
        return disaggregated_pins(prefill, decode)
    return covering_pins(prefill, decode)


def served(reply: dict, tokens: int) -> bool:
    return "error" not in reply and reply["completion_tokens"] == tokens


def from_cache(reply: dict) -> bool:
    """Served with the whole prompt but its last page cached, as the seed's cache check."""
    return (
        served(reply, TARGETED_OUTPUT_TOKENS) and reply["cached_tokens"] >= INPUT_TOKENS - PAGE_SIZE
    )


def routed_to(reply: dict, target: Target) -> bool:
    return "error" not in reply and (reply["prefill_worker_id"], reply["prefill_dp_rank"]) == target


def routed_to_all(reply: dict, holders: tuple[Target, ...]) -> bool:
    """Whether the reply's prefill or decode (worker, DP rank) is each of ``holders``."""
    if "error" in reply:
        return False
    decode_worker = reply["decode_worker_id"] or reply["prefill_worker_id"]
    routed = {(reply["prefill_worker_id"], reply["prefill_dp_rank"]),
              (decode_worker, reply["decode_dp_rank"])}  # fmt: skip
    return set(holders) <= routed


def benchmark(frontend: dynamo.Frontend) -> Benchmark:
    """The 40-request benchmark through ``frontend``, then its second pass's hit rate."""
    prompts = [kv_events.prompt(INPUT_TOKENS) for _ in range(BENCHMARK_REQUESTS)]
    started = time.monotonic()
    first = frontend.generate_many(prompts, OUTPUT_TOKENS, CONCURRENCY)
    seconds = time.monotonic() - started
    second = [r for r in frontend.generate_many(prompts, 1, CONCURRENCY) if served(r, 1)]
    prompt_tokens = sum(r["prompt_tokens"] for r in second)
    return Benchmark(
        succeeded=sum(served(r, OUTPUT_TOKENS) for r in first),
        requests=len(prompts),
        seconds=seconds,
        second_pass_hit_rate=sum(r["cached_tokens"] for r in second) / max(prompt_tokens, 1),
        first_error=next((r["error"] for r in first if "error" in r), None),
    )


def targeted(frontend: dynamo.Frontend, router, pins: list[Pin], targets: list[Target], *,
             events_deadline: float = dynamo.ROUTER_DEADLINE) -> Targeted:  # fmt: skip
    """The targeted requests through ``frontend`` and the event check on ``router`` (a
    :class:`dynamo.Router` or :class:`dynamo.PrefillDecodeRouters`, knowing ``targets``), per
    pin; a pin's events are waited for up to ``events_deadline``."""
    counts = Targeted(targets=len(targets))
    seen: set[Target] = set()
    for pin in pins:
        prompt = kv_events.prompt(INPUT_TOKENS)
        pinned = frontend.generate_many([prompt] * PINNED_PER_TARGET, TARGETED_OUTPUT_TOKENS, 1,
                                        pin.nvext)  # fmt: skip
        # The first one stores the prompt; the second is served from that cache.
        checks = [
            (from_cache(r) if index else served(r, TARGETED_OUTPUT_TOKENS))
            and routed_to_all(r, pin.holders)
            for index, r in enumerate(pinned)
        ]
        count(counts, f"{pin.holders} pinned", pinned, checks, unpinned=False)
        unseen = events_seen(router, prompt, pin.holders, targets, events_deadline)
        if unseen is None:
            seen.update(pin.holders)
        else:
            counts.failures.append(f"{pin.holders}: the router never scored its pinned prompt "
                                   f"there alone, last {unseen}")  # fmt: skip
        repeats = frontend.generate_many([prompt] * UNPINNED_PER_TARGET, TARGETED_OUTPUT_TOKENS, 1)
        checks = [from_cache(r) and routed_to(r, pin.target) for r in repeats]
        count(counts, f"{pin.target} unpinned", repeats, checks, unpinned=True)
    counts.event_targets = len(seen)
    return counts


def count(counts: Targeted, what: str, replies: list[dict], checks: list[bool], *,
          unpinned: bool) -> None:  # fmt: skip
    counts.requests += len(checks)
    counts.passed += sum(checks)
    if unpinned:
        counts.unpinned += len(checks)
        counts.unpinned_passed += sum(checks)
    counts.failures += [f"{what}: {r}" for r, ok in zip(replies, checks, strict=True) if not ok]


def events_seen(router, prompt: list[int], holders: tuple[Target, ...], targets: list[Target],
                deadline: float = dynamo.ROUTER_DEADLINE) -> dict | None:  # fmt: skip
    """None once the router scores the prompt's pages on each of ``holders`` and on no other
    target; otherwise (after ``deadline``) the last scores it gave."""
    pages = len(prompt) // PAGE_SIZE
    wanted = {t: pages if t in holders else 0 for t in targets}
    last: dict = {}

    def matches() -> bool:
        last.clear()
        last.update(router.target_scores(prompt))
        return last == wanted

    try:
        nodes.wait_for(matches, deadline, "")
    except AssertionError:
        return last
    return None


def registered_targets(router, expected: int) -> list[Target]:
    """The router's (worker, DP rank) targets once it knows ``expected`` of them, in order."""
    probe = kv_events.prompt()
    scores = nodes.wait_for(
        lambda: len(scores := router.target_scores(probe)) == expected and scores,
        dynamo.ROUTER_DEADLINE,
        f"the router to know {expected} (worker, DP rank) targets",
    )
    return sorted(scores, key=lambda target: (target[1], target[0]))


def first_served(frontend: dynamo.Frontend) -> dict:
    """One unpinned request's reply, once the frontend serves one: where it was routed names
    the deployment's workers. A frontend lists the model before every worker kind can be
    routed to (503 until then)."""
    last: list = []

    def served_once() -> dict | None:
        (reply,) = frontend.generate_many([kv_events.prompt(INPUT_TOKENS)], 1, 1)
        last[:] = [reply]
        return reply if "error" not in reply else None

    try:
        return nodes.wait_for(served_once, dynamo.ROUTER_DEADLINE, "")
    except AssertionError:
        raise AssertionError(f"the frontend served no request: {last}") from None


def benchmark_asserted_here() -> bool:
    """Whether this session is the column ``make test`` asserts: the newest release, with the
    plugin."""
    release = releases.release_of(releases.installed_sglang_version() or "0")
    return release == releases.NEWEST_RELEASE and not differences.on_rebuilt_wheel()


def measure(
    deployment: str,
    frontend: dynamo.Frontend,
    router,
    targets: list[Target],
    pins: list[Pin] | None = None,
    *,
    with_benchmark: bool = False,
) -> Measured:
    """The seed's measurements of a deployment with ``targets`` (the benchmark too when asked
    and :func:`benchmark_asserted_here`), pinned as ``pins`` say (by default one pin per
    target of an aggregated deployment)."""
    bench = benchmark(frontend) if with_benchmark and benchmark_asserted_here() else None
    pins = aggregated_pins(targets) if pins is None else pins
    return Measured(deployment, bench, targeted(frontend, router, pins, targets))


def measure_disaggregated(
    deployment: str, frontend: dynamo.Frontend, routers: dynamo.PrefillDecodeRouters, ranks: int
) -> tuple[Measured, list[Target], list[Target]]:
    """The seed's measurements of a prefill and a decode worker of ``ranks`` DP ranks each:
    once the routers know all their targets and the frontend serves a first request (which
    names the prefill and the decode worker), every (prefill, decode) pair pinned in turn.
    Returns the measures, the prefill targets and the decode targets."""
    targets = registered_targets(routers, 2 * ranks)
    frontend.wait_for_model()
    probe = first_served(frontend)
    prefill = [target for target in targets if target[0] == probe["prefill_worker_id"]]
    decode = [target for target in targets if target[0] == probe["decode_worker_id"]]
    pins = disaggregated_pins(prefill, decode)
    return measure(deployment, frontend, routers, targets, pins), prefill, decode
