"""How the seed's measurements judge replies (``overlay_harness.seed_checks``), and the tokenizer
Dynamo's frontend needs for the tiny model (``overlay_harness.tokenizer``)."""

import json

import pytest
from overlay_harness import seed_checks, testcase, tokenizer
from overlay_harness.group import PAGE_SIZE, TINY_MODEL

TARGET = (7, 1)
INPUT = seed_checks.INPUT_TOKENS
TOKENS = seed_checks.TARGETED_OUTPUT_TOKENS


def reply(cached: int, worker: int = 7, rank: int = 1, tokens: int = TOKENS,
          decode: tuple[int | None, int] | None = None) -> dict:  # fmt: skip
    decode_worker, decode_rank = decode or (None, rank)
    return {
        "prefill_worker_id": worker,
        "prefill_dp_rank": rank,
        "decode_worker_id": decode_worker,
        "decode_dp_rank": decode_rank,
        "cached_tokens": cached,
        "prompt_tokens": INPUT,
        "completion_tokens": tokens,
    }


def test_a_cache_check_needs_all_but_the_last_page_cached() -> None:
    assert seed_checks.from_cache(reply(INPUT - PAGE_SIZE))
    assert not seed_checks.from_cache(reply(INPUT - PAGE_SIZE - 1))
    assert not seed_checks.from_cache(reply(INPUT, tokens=TOKENS - 1))
    assert not seed_checks.from_cache({"error": "503"})


def test_a_reply_counts_for_its_target_only() -> None:
    assert seed_checks.routed_to(reply(0), TARGET)
    assert not seed_checks.routed_to(reply(0, worker=8), TARGET)
    assert not seed_checks.routed_to(reply(0, rank=0), TARGET)
    assert not seed_checks.routed_to({"error": "timeout"}, TARGET)


def test_a_pinned_reply_must_reach_every_holder() -> None:
    # Aggregated: the worker is its own decode worker (the frontend names no decode worker).
    assert seed_checks.routed_to_all(reply(0), (TARGET,))
    assert not seed_checks.routed_to_all(reply(0, rank=0), (TARGET,))
    # Disaggregated: the prefill target and the decode target, each on its own worker.
    pair = (TARGET, (9, 0))
    assert seed_checks.routed_to_all(reply(0, decode=(9, 0)), pair)
    assert not seed_checks.routed_to_all(reply(0, decode=(9, 1)), pair)
    assert not seed_checks.routed_to_all(reply(0, rank=0, decode=(9, 0)), pair)
    assert not seed_checks.routed_to_all({"error": "400"}, pair)


def test_disaggregated_pins_cover_every_prefill_and_decode_pair() -> None:
    prefill, decode = [(7, 0), (7, 1)], [(9, 0), (9, 1)]
    pins = seed_checks.disaggregated_pins(prefill, decode)
    assert [pin.holders for pin in pins] == [(p, d) for p in prefill for d in decode]
    assert [pin.target for pin in pins] == [p for p in prefill for _d in decode]
    assert pins[1].nvext == {"prefill_worker_id": 7, "prefill_dp_rank": 0,
                             "decode_worker_id": 9, "dp_rank": 1}  # fmt: skip
    # The seed's 36 targeted requests, 28 of them unpinned, from two ranks of each kind.
    per_pin = seed_checks.PINNED_PER_TARGET + seed_checks.UNPINNED_PER_TARGET
    assert len(pins) * per_pin == 36


def test_covering_pins_pin_every_target_of_both_kinds_once_each_side() -> None:
    # The seed's deployment 3: two prefill and two decode engines of two DP ranks each.
    prefill = [(1, 0), (1, 1), (2, 0), (2, 1)]
    decode = [(3, 0), (3, 1), (4, 0), (4, 1)]
    pins = seed_checks.covering_pins(prefill, decode)
    assert [pin.holders for pin in pins] == list(zip(prefill, decode, strict=True))
    per_pin = seed_checks.PINNED_PER_TARGET + seed_checks.UNPINNED_PER_TARGET
    assert len(pins) * per_pin == 36
    # Fewer of one kind: each of the other kind still pinned, the fewer ones in turn.
    pins = seed_checks.covering_pins(prefill[:2], decode)
    assert [pin.target for pin in pins] == [(1, 0), (1, 1), (1, 0), (1, 1)]
    assert {pin.holders[1] for pin in pins} == set(decode)
    assert seed_checks.covering_pins([], decode) == []


def test_pair_pins_take_every_pair_until_there_are_more_pairs_than_targets() -> None:
    two, four = [(7, 0), (7, 1)], [(1, 0), (1, 1), (2, 0), (2, 1)]
    decode_two, decode_four = [(9, 0), (9, 1)], [(3, 0), (3, 1), (4, 0), (4, 1)]
    pairs = seed_checks.pair_pins(two, decode_two)
    assert [pin.holders for pin in pairs] == [(p, d) for p in two for d in decode_two]
    covering = seed_checks.pair_pins(four, decode_four)
    assert [pin.holders for pin in covering] == list(zip(four, decode_four, strict=True))


def test_counts_keep_pinned_and_unpinned_apart_and_name_each_failure() -> None:
    counts = seed_checks.Targeted(targets=1)
    seed_checks.count(counts, "pinned", [reply(0), reply(112)], [True, True], unpinned=False)
    seed_checks.count(counts, "unpinned", [reply(112), reply(0)], [True, False], unpinned=True)
    assert (counts.passed, counts.requests) == (3, 4)
    assert (counts.unpinned_passed, counts.unpinned) == (1, 2)
    assert len(counts.failures) == 1 and counts.failures[0].startswith("unpinned: ")


def test_a_seed_pass_needs_every_request_and_every_target() -> None:
    whole = seed_checks.Targeted(passed=9, requests=9, unpinned_passed=7, unpinned=7,
                                 event_targets=1, targets=1)  # fmt: skip
    bench = seed_checks.Benchmark(40, 40, 12.0, 0.7, None)
    seed_checks.Measured("d", bench, whole).assert_seed_pass()
    seed_checks.Measured("d", None, whole).assert_seed_pass()
    short = seed_checks.Benchmark(39, 40, 12.0, 0.7, "HTTP 500")
    with pytest.raises(AssertionError, match="benchmark 39/40: HTTP 500"):
        seed_checks.Measured("d", short, whole).assert_seed_pass()
    unseen = seed_checks.Targeted(passed=9, requests=9, event_targets=0, targets=1)
    with pytest.raises(AssertionError, match="event targets 0/1"):
        seed_checks.Measured("d", bench, unseen).assert_seed_pass()


def test_a_short_seed_row_prints_every_logs_tail_before_failing(tmp_path, capsys) -> None:
    (tmp_path / "node0").mkdir()
    (tmp_path / "node0" / "sidecar.log").write_text("".join(f"s{i}\n" for i in range(100)))
    (tmp_path / "frontend.log").write_text("504 Request deadline exceeded\n")
    (tmp_path / "notes.txt").write_text("not a log\n")
    case = testcase.DeploymentTestCase()
    case.workdir = tmp_path
    stalled = seed_checks.Targeted(passed=21, requests=36, event_targets=4, targets=4)
    with pytest.raises(AssertionError, match="targeted 21/36"):
        case.assert_seed_pass(seed_checks.Measured("4", None, stalled))
    err = capsys.readouterr().err
    assert "seed table: 4 |" in err and "--- frontend.log (tail) ---" in err
    assert "504 Request deadline exceeded" in err and "not a log" not in err
    assert "--- node0/sidecar.log (tail) ---" in err and "s99" in err and "s39\n" not in err
    whole = seed_checks.Targeted(passed=36, requests=36, event_targets=4, targets=4)
    case.assert_seed_pass(seed_checks.Measured("4", None, whole))
    assert "(tail)" not in capsys.readouterr().err


def test_the_tokenizer_covers_the_model_vocabulary_and_builds_the_same_every_time(
    tmp_path,
) -> None:
    from transformers import AutoTokenizer

    first = tokenizer.build(TINY_MODEL, tmp_path / "a")
    second = tokenizer.build(TINY_MODEL, tmp_path / "b")
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()
    # Beside the model's config, which Dynamo's sidecar reads from the tokenizer's directory.
    assert (first / "config.json").read_text() == (TINY_MODEL / "config.json").read_text()
    vocab = json.loads((TINY_MODEL / "config.json").read_text())["vocab_size"]
    loaded = AutoTokenizer.from_pretrained(first)
    assert len(loaded) == vocab
    assert loaded.decode(loaded("hello world 12345")["input_ids"]) == "hello world 12345"
    chat = loaded.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                      add_generation_prompt=True)  # fmt: skip
    assert chat.endswith("<|im_start|>assistant\n")
