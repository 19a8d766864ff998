"""contract.server_info: the legacy dp_size switch, rank space, the one builder, redaction and
the schema."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import re
from pathlib import Path

import jsonschema
import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_sidecar_overlay.contract.incarnation import CONTRACT_VERSION, Incarnation
from sglang_sidecar_overlay.contract.redaction import (
    REDACTED,
    is_secret_name,
    redact,
    redact_launch_command,
    secret_name_pattern,
)
from sglang_sidecar_overlay.contract.schema import contract_validator, load_schema
from sglang_sidecar_overlay.contract.server_info import (
    LEGACY_DP_SIZE_ENV,
    build_server_info,
    legacy_dp_size_enabled,
    rank_space,
    render_server_info,
)
from sglang_sidecar_overlay.contract.sources import SourceConflictError, describe_source

REPO = ROOT
PACKAGE_SCHEMA = REPO / "python" / "sglang_sidecar_overlay" / "contract" / "server-info.schema.json"
DOCS_SCHEMA = REPO / "docs" / "server-info.schema.json"
# A fixed launch keeps the builder's output deterministic in these tests.
LAUNCH = Incarnation(id="0123456789abcdef" * 2, started_at=1_700_000_000.25)


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    # The validator probe uses: strict integers and numbers, the endpoint format checked.
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return contract_validator(schema)


# --- legacy dp_size switch ----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "on", " On "])
def test_legacy_switch_on(value):
    assert legacy_dp_size_enabled({LEGACY_DP_SIZE_ENV: value}) is True


@pytest.mark.parametrize("value", ["0", "false", "no", "off", ""])
def test_legacy_switch_off(value):
    assert legacy_dp_size_enabled({LEGACY_DP_SIZE_ENV: value}) is False


def test_legacy_switch_defaults_off_and_reads_the_process_environment(monkeypatch):
    assert legacy_dp_size_enabled({}) is False
    monkeypatch.setenv(LEGACY_DP_SIZE_ENV, "yes")
    assert legacy_dp_size_enabled() is True
    monkeypatch.delenv(LEGACY_DP_SIZE_ENV)
    assert legacy_dp_size_enabled() is False


def test_legacy_switch_defaults_on_only_for_a_sidecar_that_checks_dp_size():
    assert legacy_dp_size_enabled({}, sidecar="dynamo.sglang.sidecar") is True
    assert legacy_dp_size_enabled({}, sidecar="dynamo.sglang") is False
    assert legacy_dp_size_enabled({}, sidecar="my_org.sidecar") is False
    assert legacy_dp_size_enabled({}, sidecar=None) is False


@pytest.mark.parametrize("value", ["0", "off", ""])
def test_legacy_switch_set_off_wins_over_the_sidecar_default(value):
    env = {LEGACY_DP_SIZE_ENV: value}
    assert legacy_dp_size_enabled(env, sidecar="dynamo.sglang.sidecar") is False


@pytest.mark.parametrize("value", ["2", "enable", "y e s"])
def test_legacy_switch_bad_value_is_named(value):
    with pytest.raises(ValueError, match=f"{LEGACY_DP_SIZE_ENV}='{value}'"):
        legacy_dp_size_enabled({LEGACY_DP_SIZE_ENV: value})


# --- rank space ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("server_args", "expected"),
    [
        # 0.5.19-0.5.21: no attn_dp_size key; dp_size is the total.
        ({"dp_size": 1}, (1, 1, 1)),
        ({"dp_size": 4}, (4, 4, 1)),
        ({"dp_size": 2, "enable_dp_attention": True}, (2, 1, 2)),
        ({"dp_size": 2, "enable_dp_attention": False}, (2, 2, 1)),
        # 0.5.22+: dp_size counts replicas, attn_dp_size attention-DP groups.
        ({"dp_size": 1, "attn_dp_size": 2, "enable_dp_attention": True}, (2, 1, 2)),
        ({"dp_size": 2, "attn_dp_size": 1, "enable_dp_attention": False}, (2, 2, 1)),
        ({"dp_size": 1, "attn_dp_size": 1}, (1, 1, 1)),
        ({}, (1, 1, 1)),
    ],
)
def test_rank_space_both_api_generations(server_args, expected):
    space = rank_space(server_args, [])
    assert (space["size"], space["system_dp_size"], space["attn_dp_size"]) == expected
    assert space["local_ranks"] == []


def test_same_launch_gives_the_same_rank_space_on_both_generations():
    # `--dp 2 --enable-dp-attention` as 0.5.21 and as 0.5.22 report it.
    old = rank_space({"dp_size": 2, "enable_dp_attention": True}, [1])
    new = rank_space({"dp_size": 1, "attn_dp_size": 2, "enable_dp_attention": True}, [1])
    assert old == new == {"size": 2, "system_dp_size": 1, "attn_dp_size": 2, "local_ranks": [1]}


def test_rank_space_local_ranks_sorted_and_unique():
    assert rank_space({"dp_size": 8}, [5, 2, 5])["local_ranks"] == [2, 5]


def test_rank_outside_space_is_named():
    with pytest.raises(ValueError, match=r"dp_rank 2 .* size 2"):
        rank_space({"dp_size": 1, "attn_dp_size": 2}, [0, 2])


def test_both_dp_widths_above_one_are_refused():
    with pytest.raises(ValueError, match="dp_size=2 with attn_dp_size=2"):
        rank_space({"dp_size": 2, "attn_dp_size": 2}, [])


@pytest.mark.parametrize("bad", [0, -1, True, "2"])
def test_bad_width_is_named(bad):
    with pytest.raises(ValueError, match=repr(bad)):
        rank_space({"dp_size": bad}, [])


# --- builder ------------------------------------------------------------------------------------


def _server_args(**overrides) -> dict:
    args = {
        "model_path": "Qwen/Qwen3-0.6B",
        "tokenizer_path": "Qwen/Qwen3-0.6B",
        "served_model_name": "qwen",
        "node_rank": 0,
        "nnodes": 2,
        "dist_init_addr": "10.0.0.1:5000",
        "tp_size": 2,
        "dp_size": 1,
        "attn_dp_size": 1,
        "enable_dp_attention": False,
        "page_size": 16,
        "dcp_size": 1,
        "disaggregation_mode": "null",
        "api_key": "sk-live-123",
        "admin_api_key": None,
        "ssl_keyfile": "/etc/tls/key.pem",
        "ssl_keyfile_password": "hunter2",
        "watermark_key": "wm-secret",
        "bucket_time_to_first_token": [0.1, 0.5],
        "kt_max_deferred_experts_per_token": 4,
    }
    args.update(overrides)
    return args


READY = {"status": "ready", "max_total_num_tokens": 4096, "max_req_input_len": 2048}
KV_EVENTS = {
    "publisher": "zmq",
    "endpoint_host": "*",
    "endpoint_port_base": 5557,
    "topic": "",
    "block_size": 16,
    "dp_size": 2,
}
COMMAND = "python -m sglang.launch_server --model-path Qwen/Qwen3-0.6B --api-key sk-live-123"


def test_leader_server_info(validator):
    source = describe_source(0, "tcp://0.0.0.0:5557", "", 16, replay_endpoint="tcp://*:5600")
    info = build_server_info(
        _server_args(),
        {**READY, "kv_event_sources": [source]},
        launch_command=COMMAND,
        kv_events=KV_EVENTS,
        incarnation=LAUNCH,
    )
    validator.validate(info)
    assert info["kv_event_sources"] == [
        {
            "dp_rank": 0,
            "endpoint": "tcp://127.0.0.1:5557",
            "topic": "",
            "block_size": 16,
            "encoding": "msgpack",
            "replay_endpoint": "tcp://127.0.0.1:5600",
        }
    ]
    assert info["contract_version"] == CONTRACT_VERSION == 3
    assert info["incarnation"] == {"id": "0123456789abcdef" * 2, "started_at": 1_700_000_000.25}
    assert info["kv_events"] == KV_EVENTS
    assert info["kv_event_rank_space"] == {
        "size": 1,
        "system_dp_size": 1,
        "attn_dp_size": 1,
        "local_ranks": [0],
    }
    assert info["status"] == "ready" and info["max_total_num_tokens"] == 4096
    assert info["tokenizer_path"] == "Qwen/Qwen3-0.6B"
    assert "sk-live-123" not in render_server_info(info)


def test_follower_server_info_attention_dp(validator):
    # 0.5.22+ `--dp 2 --enable-dp-attention` on two nodes: the follower owns rank 1.
    args = _server_args(node_rank=1, attn_dp_size=2, enable_dp_attention=True)
    sources = [describe_source(1, "tcp://*:5558", "", 16)]
    info = build_server_info(
        args, READY, kv_events=KV_EVENTS, kv_event_sources=sources, incarnation=LAUNCH
    )
    validator.validate(info)
    assert info["dp_size"] == 1 and info["attn_dp_size"] == 2
    assert info["kv_event_rank_space"] == {
        "size": 2,
        "system_dp_size": 1,
        "attn_dp_size": 2,
        "local_ranks": [1],
    }
    assert info["launch_command"] is None


def test_legacy_dp_size_reports_publisher_count(validator):
    args = _server_args(node_rank=1, attn_dp_size=2, enable_dp_attention=True)
    sources = [describe_source(1, "tcp://*:5558", "", 16)]
    info = build_server_info(
        args, READY, kv_event_sources=sources, legacy_dp_size=True, incarnation=LAUNCH
    )
    validator.validate(info)
    assert (info["dp_size"], info["attn_dp_size"]) == (2, 1)
    assert info["enable_dp_attention"] is True
    # SGLang's own widths stay in the rank space.
    assert info["kv_event_rank_space"] == {
        "size": 2,
        "system_dp_size": 1,
        "attn_dp_size": 2,
        "local_ranks": [1],
    }


@pytest.mark.parametrize(
    ("consumer", "registers"),
    [
        ("ai-dynamo <= 1.6.1", lambda info: info["dp_size"]),
        ("ai-dynamo >= 1.7", lambda info: info["dp_size"] * info.get("attn_dp_size", 1)),
    ],
)
@pytest.mark.parametrize("legacy", [True, False])
def test_legacy_dp_size_is_registered_exactly_by_every_dynamo_rule(consumer, registers, legacy):
    """Each Dynamo version checks ranks against, and registers, its own product of the
    widths: with the switch on, both equal the rank space on every node of the group."""
    infos = [
        build_server_info(
            _server_args(node_rank=rank, attn_dp_size=2, enable_dp_attention=True),
            READY,
            kv_event_sources=[describe_source(rank, f"tcp://*:{5557 + rank}", "", 16)],
            legacy_dp_size=legacy,
            incarnation=LAUNCH,
        )
        for rank in (0, 1)
    ]
    registered = {registers(info) for info in infos}
    exact = registered == {2} and all(
        source["dp_rank"] < registers(info) for info in infos for source in info["kv_event_sources"]
    )
    # Off, SGLang's own widths: 1.6.1 sees one rank (and rejects rank 1), 1.7 sees both.
    assert exact is (legacy or consumer == "ai-dynamo >= 1.7"), (consumer, registered)


def test_legacy_dp_size_changes_nothing_on_the_old_generation(validator):
    args = _server_args(dp_size=2, enable_dp_attention=True)
    del args["attn_dp_size"]
    sources = [describe_source(0, "tcp://*:5557", "", 16)]
    plain = build_server_info(args, READY, kv_event_sources=sources, incarnation=LAUNCH)
    legacy = build_server_info(
        args, READY, kv_event_sources=sources, legacy_dp_size=True, incarnation=LAUNCH
    )
    validator.validate(plain)
    assert plain == legacy
    assert "attn_dp_size" not in plain


def test_node_without_publishers(validator):
    info = build_server_info(_server_args(node_rank=1), READY, incarnation=LAUNCH)
    validator.validate(info)
    assert info["kv_event_sources"] == []
    assert info["kv_event_rank_space"]["local_ranks"] == []
    assert info["kv_events"] is None


def test_sources_default_to_scheduler_info_and_are_aggregated():
    a = describe_source(1, "tcp://*:5558", "", 16)
    b = describe_source(0, "tcp://*:5557", "", 16)
    args = _server_args(dp_size=2, attn_dp_size=1)
    info = build_server_info(args, {**READY, "kv_event_sources": [a, b, a]}, incarnation=LAUNCH)
    assert [source["dp_rank"] for source in info["kv_event_sources"]] == [0, 1]
    explicit = build_server_info(
        args, {**READY, "kv_event_sources": [a]}, kv_event_sources=[b], incarnation=LAUNCH
    )
    assert [source["dp_rank"] for source in explicit["kv_event_sources"]] == [0]


def test_source_rank_outside_rank_space_is_refused():
    sources = [describe_source(1, "tcp://*:5558", "", 16)]
    with pytest.raises(ValueError, match=r"dp_rank 1 .* size 1"):
        build_server_info(_server_args(), READY, kv_event_sources=sources, incarnation=LAUNCH)


def test_conflicting_sources_are_refused():
    sources = [
        describe_source(0, "tcp://*:5557", "", 16),
        describe_source(0, "tcp://*:5558", "", 16),
    ]
    with pytest.raises(SourceConflictError):
        build_server_info(_server_args(), READY, kv_event_sources=sources, incarnation=LAUNCH)


def test_launch_command_from_server_args_is_kept_and_redacted():
    info = build_server_info(_server_args(launch_command=COMMAND), READY, incarnation=LAUNCH)
    assert info["launch_command"].startswith("python -m sglang.launch_server")
    assert "sk-live-123" not in info["launch_command"]


def test_builder_does_not_mutate_its_inputs():
    args, ready, events = _server_args(), dict(READY), json.loads(json.dumps(KV_EVENTS))
    build_server_info(args, ready, kv_events=events, launch_command=COMMAND, incarnation=LAUNCH)
    assert args == _server_args() and ready == READY and events == KV_EVENTS


# --- JSON rendering -----------------------------------------------------------------------------


class Mode(enum.Enum):
    DECODE = "decode"


@dataclasses.dataclass
class Lora:
    name: str
    rank: int


def test_non_json_values_are_rendered_as_text():
    args = _server_args(
        disaggregation_mode=Mode.DECODE,
        model_path=Path("/models/qwen"),
        lora=Lora("a", 8),
        tags={"b", "a"},
        ratio=float("nan"),
        blob=b"raw",
        callback=object,
        by_id={1: "x"},
        started=datetime.datetime(2026, 1, 2, 3, 4, 5),
    )
    info = build_server_info(args, READY, incarnation=LAUNCH)
    assert info["disaggregation_mode"] == "decode"
    assert info["model_path"] == "/models/qwen"
    assert info["lora"] == {"name": "a", "rank": 8}
    assert info["tags"] == ["a", "b"]
    assert info["ratio"] == "nan"
    assert info["blob"] == "raw"
    assert info["callback"] == str(object)
    assert info["by_id"] == {"1": "x"}
    assert info["started"] == "2026-01-02T03:04:05"
    assert json.loads(render_server_info(info)) == info


def test_render_is_deterministic_and_keeps_non_ascii():
    args = _server_args(served_model_name="通义千问-é")
    first = render_server_info(
        build_server_info(args, READY, launch_command=COMMAND, incarnation=LAUNCH)
    )
    second = render_server_info(
        build_server_info(dict(args), dict(READY), launch_command=COMMAND, incarnation=LAUNCH)
    )
    assert first == second
    assert "通义千问-é" in first
    assert "\\u" not in first


# --- redaction ----------------------------------------------------------------------------------

SECRET_NAMES = [
    "api_key",
    "admin_api_key",
    "ssl_keyfile_password",
    "watermark_key",
    "hf_token",
    "HF_TOKEN",
    "watermark-secret",
    "aws_credentials",
    "db_credential",
    "db_passwd",
    "key",
]
PUBLIC_NAMES = [
    "max_total_num_tokens",
    "tokenizer_path",
    "tokenizer",
    "ssl_keyfile",
    "key_value_cache",
    "bucket_time_to_first_token",
    "kt_max_deferred_experts_per_token",
    "tokens",
    "keys",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_public_names(name):
    assert not is_secret_name(name)


def test_rule_over_release_field_names_hits_exactly_the_known_ones():
    # Field names of the supported releases that end in a secret word (see the issue).
    hits = {"api_key", "admin_api_key", "ssl_keyfile_password", "watermark_key"}
    near_misses = {"bucket_time_to_first_token", "kt_max_deferred_experts_per_token"}
    others = {"max_total_num_tokens", "tokenizer_path", "ssl_keyfile", "max_prefill_tokens"}
    assert {name for name in hits | near_misses | others if is_secret_name(name)} == hits


def test_redact_nested_keys_at_any_depth():
    value = {
        "outer": [{"hf_token": "t1", "keep": 1}, {"deeper": {"client_secret": "s1"}}],
        "watermark_key": {"whole": "subtree"},
        "api_key": None,
        "tokenizer_path": "p",
    }
    assert redact(value) == {
        "outer": [{"hf_token": REDACTED, "keep": 1}, {"deeper": {"client_secret": REDACTED}}],
        "watermark_key": REDACTED,
        "api_key": None,
        "tokenizer_path": "p",
    }


def test_redact_does_not_mutate():
    value = {"api_key": "x", "nested": {"hf_token": "y"}}
    redact(value)
    assert value == {"api_key": "x", "nested": {"hf_token": "y"}}


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("serve --api-key s3cr3t --port 1", "serve --api-key '<redacted>' --port 1"),
        ("serve --api-key=s3cr3t --port 1", "serve '--api-key=<redacted>' --port 1"),
        ("serve --api_key s3cr3t", "serve --api_key '<redacted>'"),
        ("serve --watermark-key 'a b c'", "serve --watermark-key '<redacted>'"),
        ("serve --hf-token --port 1", "serve --hf-token --port 1"),
        ("serve --admin-api-key", "serve --admin-api-key"),
        ("HF_TOKEN=s3cr3t serve", "'HF_TOKEN=<redacted>' serve"),
        (
            'serve --json-model-override-args \'{"hf_token": "s3cr3t", "n": 1}\'',
            'serve --json-model-override-args \'{"hf_token": "<redacted>", "n": 1}\'',
        ),
        (
            "serve --bucket-time-to-first-token 0.1 0.5",
            "serve --bucket-time-to-first-token 0.1 0.5",
        ),
        (
            "serve --ssl-keyfile /k.pem --ssl-keyfile-password pw",
            "serve --ssl-keyfile /k.pem --ssl-keyfile-password '<redacted>'",
        ),
    ],
)
def test_redact_launch_command_forms(command, expected):
    result = redact_launch_command(command)
    assert result == expected
    for secret in ("s3cr3t", "a b c", " pw"):
        assert secret not in result


def test_redact_launch_command_untouched_text_is_returned_verbatim():
    command = "python  -m sglang.launch_server --model-path \"m\" --tokenizer-path 't'"
    assert redact_launch_command(command) is command


def test_redact_launch_command_with_unbalanced_quote_still_hides():
    result = redact_launch_command("serve --api-key s3cr3t --name 'oops")
    assert "s3cr3t" not in result


@settings(max_examples=500)
@given(
    st.lists(st.text(alphabet="abc-_=' {}\"", min_size=1, max_size=8), max_size=6),
    st.text(alphabet="XYZ0123", min_size=3, max_size=10),
)
def test_redacted_command_never_contains_the_secret_value(words, secret):
    command = " ".join([*words, "--api-key", secret, *words])
    assert secret not in redact_launch_command(command).replace(REDACTED, "")


# --- schema -------------------------------------------------------------------------------------


def test_docs_schema_is_a_byte_identical_copy_of_the_packaged_one():
    assert DOCS_SCHEMA.read_bytes() == PACKAGE_SCHEMA.read_bytes()
    assert load_schema() == json.loads(DOCS_SCHEMA.read_text(encoding="utf-8"))


def test_schema_secret_pattern_is_generated_from_the_redaction_rule():
    assert list(load_schema()["patternProperties"]) == [secret_name_pattern()]


@pytest.mark.parametrize(
    "name",
    [
        "api_key",
        "hf_token",
        "SSL-KEYFILE-PASSWORD",
        "aws_secret",
        "db_passwd",
        "x_credentials",
        "bucket_time_to_first_token",
        "kt_max_deferred_experts_per_token",
        "keyboard",
        "tokenizer",
    ],
)
def test_schema_secret_pattern_agrees_with_is_secret_name(name):
    # JSON Schema matches the raw key; is_secret_name folds '-' to '_' and case, as the regex.
    assert bool(re.search(secret_name_pattern(), name)) == is_secret_name(name)


def test_schema_rejects_an_unredacted_secret(validator):
    info = build_server_info(_server_args(), READY, incarnation=LAUNCH)
    info["api_key"] = "sk-live-123"
    assert not validator.is_valid(info)


@pytest.mark.parametrize(
    "endpoint",
    ["tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://[::]:5557", "tcp://h:0", "ipc://rel.sock"],
)
def test_schema_rejects_undialable_endpoints(validator, endpoint):
    info = build_server_info(_server_args(), READY, incarnation=LAUNCH)
    info["kv_event_sources"] = [{"dp_rank": 0, "endpoint": endpoint, "topic": "", "block_size": 16}]
    assert not validator.is_valid(info)


def test_schema_rejects_a_changed_rank_space_shape(validator):
    info = build_server_info(_server_args(), READY, incarnation=LAUNCH)
    info["kv_event_rank_space"]["extra"] = 1
    assert not validator.is_valid(info)
    del info["kv_event_rank_space"]
    assert not validator.is_valid(info)
