"""contract.redaction: every path a secret can take into server info is closed, nothing else
changes.

Unit cases for each form (names, JSON and Python-literal objects in strings, URL credentials,
secret query parameters, flags, ``NAME=value`` prefixes) and hypothesis properties: canaries
planted anywhere in random server args and command lines never survive ``build_server_info``
+ ``render_server_info``; redaction is idempotent; data without secrets is returned unchanged.
"""

from __future__ import annotations

import json
import shlex
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang_sidecar_overlay.contract.incarnation import Incarnation
from sglang_sidecar_overlay.contract.redaction import (
    QUERY_SECRET_WORDS,
    REDACTED,
    SECRET_WORDS,
    is_secret_name,
    is_secret_query_name,
    redact,
    redact_launch_command,
    redact_text,
)
from sglang_sidecar_overlay.contract.server_info import build_server_info, render_server_info
from sglang_sidecar_overlay.tools.probe import check_server_info

READY = {"status": "ready", "max_total_num_tokens": 4096, "max_req_input_len": 2048}
BASE_ARGS = {"model_path": "/models/m", "node_rank": 0, "nnodes": 1, "dp_size": 1}
LAUNCH = Incarnation(id="0123456789abcdef" * 2, started_at=1_700_000_000.0)

# --- unit cases ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '{"access_key": "AK1", "secret_key": "SK1", "bucket": "b"}',
            '{"access_key": "<redacted>", "secret_key": "<redacted>", "bucket": "b"}',
        ),
        (
            '{"storage": {"auth": [{"session_token": "T1"}]}, "n": 1}',
            '{"storage": {"auth": [{"session_token": "<redacted>"}]}, "n": 1}',
        ),
        (
            "{'secret_key': 'SK1', 'endpoint': 'http://h:1'}",
            "{'secret_key': '<redacted>', 'endpoint': 'http://h:1'}",
        ),
        ("s3://user:pass@bucket/m", "s3://<redacted>@bucket/m"),
        ("https://ghp_T0K3N@github.com/o/r.git", "https://<redacted>@github.com/o/r.git"),
        ("redis://:pw@10.0.0.1:6379/0", "redis://<redacted>@10.0.0.1:6379/0"),
        ("s3://AK:p@ss@bucket/m", "s3://<redacted>@bucket/m"),
        (
            "https://b.s3.amazonaws.com/m?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F1"
            "&X-Amz-Signature=abc&X-Amz-Security-Token=t&X-Amz-Date=20260101",
            "https://b.s3.amazonaws.com/m?X-Amz-Algorithm=AWS4&X-Amz-Credential=<redacted>"
            "&X-Amz-Signature=<redacted>&X-Amz-Security-Token=<redacted>&X-Amz-Date=20260101",
        ),
        (
            "https://a.blob.core.windows.net/c/m?sv=2020&sp=r&sig=S1G",
            "https://a.blob.core.windows.net/c/m?sv=2020&sp=r&sig=<redacted>",
        ),
        ("http://h/p?token=t&page=2", "http://h/p?token=<redacted>&page=2"),
        ("--api-key=X1", "--api-key=<redacted>"),
        ("HF_TOKEN=X1", "HF_TOKEN=<redacted>"),
        ('{"secret_key": "unterminated', '{"secret_key": "<redacted>"'),
    ],
)
def test_redact_text_forms(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "[::1]:5000",
        "tcp://10.0.0.1:5557",
        "https://huggingface.co/Qwen/Qwen3-0.6B?revision=main&x=1",
        '{"a":1,  "b" : [1, 2]}',
        "{'keep': 'me'}",
        "{not json at all",
        "ssh://host/path",
        "mailto:someone@example.com",
        "a=b c=d",
        "Qwen/Qwen3-0.6B",
        "",
        REDACTED,
    ],
)
def test_redact_text_keeps_non_secret_text_byte_identical(text: str) -> None:
    assert redact_text(text) is text or redact_text(text) == text


def test_model_path_url_credentials_hidden_in_field_and_launch_command() -> None:
    args = {**BASE_ARGS, "model_path": "s3://user:pa55@bucket/m"}
    command = "python -m sglang.launch_server --model-path s3://user:pa55@bucket/m --port 30000"
    info = build_server_info(args, READY, launch_command=command, incarnation=LAUNCH)
    text = render_server_info(info)
    assert "pa55" not in text
    assert "user:" not in text
    assert info["model_path"] == "s3://<redacted>@bucket/m"
    assert info["launch_command"] == (
        "python -m sglang.launch_server --model-path 's3://<redacted>@bucket/m' --port 30000"
    )


def test_hicache_extra_config_json_in_server_arg_and_command() -> None:
    config = json.dumps({"access_key": "AK-canary", "secret_key": "SK-canary", "region": "x"})
    args = {**BASE_ARGS, "hicache_storage_backend_extra_config": config}
    command = shlex.join(
        ["sglang", "serve", "--hicache-storage-backend-extra-config", config, "--port", "1"]
    )
    info = build_server_info(args, READY, launch_command=command, incarnation=LAUNCH)
    text = render_server_info(info)
    assert "AK-canary" not in text
    assert "SK-canary" not in text
    assert json.loads(info["hicache_storage_backend_extra_config"]) == {
        "access_key": REDACTED,
        "secret_key": REDACTED,
        "region": "x",
    }


def test_argument_lists_hide_the_value_after_a_secret_flag() -> None:
    assert redact(["--api-key", "X1", "--port", "1", "--hf-token", "--x"]) == [
        "--api-key",
        REDACTED,
        "--port",
        "1",
        "--hf-token",
        "--x",
    ]
    assert redact(("serve", "--admin-api-key", "X2")) == ("serve", "--admin-api-key", REDACTED)


def test_secret_nested_deeper_than_the_parser_goes_is_still_hidden() -> None:
    deep = '{"a": ' * 10_000 + '{"secret_key": "DEEP-canary"}' + "}" * 10_000
    result = redact_text(deep)
    assert "DEEP-canary" not in result
    assert redact_text(result) == result


def test_query_names() -> None:
    for name in ("sig", "Signature", "X-Amz-Signature", "X-Amz-Credential", "token", "apikey"):
        assert is_secret_query_name(name), name
    for name in ("X-Amz-Date", "X-Amz-Algorithm", "sv", "sp", "page", "revision"):
        assert not is_secret_query_name(name), name


def test_probe_flags_a_served_url_credential_or_json_secret() -> None:
    info = build_server_info(BASE_ARGS, READY, incarnation=LAUNCH)
    info["model_path"] = "s3://u:pw@b/m"
    info["extra"] = {"config": '{"secret_key": "x"}'}
    _, findings = check_server_info(json.dumps(info))
    flagged = {f.field for f in findings if f.level == "error" and f.check == "secrets"}
    assert flagged == {"model_path", "extra.config"}


def test_probe_accepts_redacted_output() -> None:
    args = {**BASE_ARGS, "model_path": "s3://u:pw@b/m", "api_key": "k"}
    info = build_server_info(
        args, READY, launch_command="x --api-key k https://h/?sig=s", incarnation=LAUNCH
    )
    _, findings = check_server_info(render_server_info(info))
    assert not [f for f in findings if f.check == "secrets"]


# --- properties ---------------------------------------------------------------------------------

CANARY = st.uuids().map(lambda u: f"cnry{u.hex[:20]}")
SAFE_KEY = st.from_regex(r"[a-z]{1,8}(_[a-z]{1,8}){0,2}", fullmatch=True).filter(
    lambda key: not is_secret_name(key) and not is_secret_query_name(key)
)
# Text without any of the marks the rule acts on ('=', '@', '-', '{', '[').
SAFE_TEXT = st.text(alphabet=string.ascii_letters + string.digits + " .,:/_()!~", max_size=24)
SAFE_URL = st.builds(
    lambda host, path, key, value: f"https://{host}.example/{path}?{key}={value}&page=2",
    st.from_regex(r"[a-z]{1,8}", fullmatch=True),
    st.from_regex(r"[a-z0-9/]{0,12}", fullmatch=True),
    SAFE_KEY,
    st.from_regex(r"[a-z0-9]{0,8}", fullmatch=True),
)
SAFE_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    SAFE_TEXT,
    SAFE_URL,
    st.floats(allow_nan=False, allow_infinity=False),
)
SAFE_DATA = st.recursive(
    SAFE_SCALAR,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(SAFE_KEY, children, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def secret_names(draw: st.DrawFn) -> str:
    prefix = draw(st.sampled_from(["", "api", "hf", "aws_secret_access", "client", "db_admin"]))
    word = draw(st.sampled_from(sorted(SECRET_WORDS)))
    name = f"{prefix}_{word}" if prefix else word
    return draw(st.sampled_from([name, name.upper(), name.replace("_", "-")]))


QUERY_NAMES = st.sampled_from(
    [
        "token",
        "access_token",
        "sig",
        "signature",
        "Signature",
        "X-Amz-Signature",
        "X-Amz-Credential",
        "X-Amz-Security-Token",
        "X-Goog-Signature",
        "X-Goog-Credential",
        "AWSAccessKeyId",
        "api_key",
        "apikey",
        "password",
        *sorted(QUERY_SECRET_WORDS),
    ]
)


@st.composite
def wrapped(draw: st.DrawFn, value: object) -> object:
    """``value`` at a random depth inside dicts/lists of non-secret data."""
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            value = {**draw(st.dictionaries(SAFE_KEY, SAFE_SCALAR, max_size=2)), "k": value}
        else:
            value = [*draw(st.lists(SAFE_SCALAR, max_size=2)), value]
    return value


@st.composite
def planted(draw: st.DrawFn, canary: str) -> tuple[object, list[str]]:
    """One canary in one of the forms the rule must hide: (a server-arg value, command words)."""
    name = draw(secret_names())
    flag = "--" + draw(secret_names()).lower().replace("_", "-")
    host = draw(st.from_regex(r"[a-z]{1,8}", fullmatch=True))
    scheme = draw(st.sampled_from(["s3", "https", "gs", "redis", "hf"]))
    nested = draw(wrapped({name: canary}))
    kind = draw(
        st.sampled_from(
            [
                "name",
                "url_password",
                "url_user",
                "query",
                "json",
                "python",
                "json_url",
                "flag",
                "flag_eq",
                "env",
                "list_flag",
            ]
        )
    )
    if kind == "name":
        return nested, [f"--{name.lower().replace('_', '-')}", canary]
    if kind == "url_password":
        url = f"{scheme}://user:{canary}@{host}/m"
        return url, ["--model-path", url]
    if kind == "url_user":
        url = f"{scheme}://{canary}@{host}/m"
        return url, [f"--model-path={url}"]
    if kind == "query":
        url = f"https://{host}/m?a=1&{draw(QUERY_NAMES)}={canary}&b=2"
        return url, ["--weight-loader-url", url]
    if kind == "json":
        text = json.dumps(nested)
        return text, ["--extra-config", text]
    if kind == "python":
        text = repr(nested)
        return text, [f"--extra-config={text}"]
    if kind == "json_url":
        text = json.dumps({"endpoint": f"{scheme}://u:{canary}@{host}/x"})
        return text, ["--extra-config", text]
    if kind == "flag":
        return f"{flag} {canary} --port 1", [flag, canary]
    if kind == "flag_eq":
        return f"{flag}={canary}", [f"{flag}={canary}"]
    if kind == "env":
        env = name.upper().replace("-", "_")
        return f"{env}={canary} python -m x", [f"{env}={canary}"]
    return ["serve", flag, canary], [flag, canary]


@st.composite
def planted_launch(draw: st.DrawFn) -> tuple[dict, str, list[str]]:
    canaries = draw(st.lists(CANARY, min_size=1, max_size=6, unique=True))
    args = dict(draw(st.dictionaries(SAFE_KEY, SAFE_DATA, max_size=6)))
    words = ["python", "-m", "sglang.launch_server"]
    for index, canary in enumerate(canaries):
        value, command_words = draw(planted(canary))
        args[f"planted_{index}"] = value
        words += command_words
    args.update(BASE_ARGS)
    return args, shlex.join(words), canaries


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planted_launch())
def test_no_planted_canary_survives_the_builder(case: tuple[dict, str, list[str]]) -> None:
    args, command, canaries = case
    info = build_server_info(args, READY, launch_command=command, incarnation=LAUNCH)
    text = render_server_info(info)
    for canary in canaries:
        assert canary not in text
    assert redact(info) == info


@settings(max_examples=300, deadline=None)
@given(SAFE_DATA, SAFE_KEY)
def test_data_without_secrets_is_unchanged(data: object, key: str) -> None:
    args = {key: data, **BASE_ARGS}
    info = build_server_info(args, READY, incarnation=LAUNCH)
    assert info[key] == json.loads(json.dumps(data))
    assert redact(data) == data
    text = json.dumps(data)
    assert redact_text(text) == text
    assert redact_text(repr(data)) == repr(data)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_redact_text_is_idempotent_and_total(text: str) -> None:
    once = redact_text(text)
    assert redact_text(once) == once


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab-_=:/@?&{}[]\"' ", max_size=10), max_size=8), CANARY)
def test_launch_command_with_random_noise_hides_a_flag_value(words: list[str], canary: str) -> None:
    command = shlex.join([*words, "--api-key", canary, *words])
    result = redact_launch_command(command)
    assert canary not in result
    assert redact_launch_command(result) == result


def test_json_argument_of_a_launch_command_joined_without_quotes():
    # What a launcher that joins argv with spaces records: the JSON's words split apart.
    command = (
        "python -m sglang.launch_server --hicache-storage-backend-extra-config "
        '{"access_key": "AKIA-CANARY", "auth": {"token": "TOKEN-CANARY"}} --tp 2'
    )
    redacted = redact_launch_command(command)
    assert "AKIA-CANARY" not in redacted and "TOKEN-CANARY" not in redacted
    assert "--tp 2" in redacted


def test_a_launch_command_joined_unquoted_with_json_secrets_is_redacted_once_and_for_all():
    # What SGLang records (" ".join(argv)) for a real launch with a secret key flag and JSON
    # configs holding secrets: one pass must already be a fixed point, so a probe re-checking
    # the served text finds nothing left.
    argv = [
        "python", "-m", "sglang.launch_server", "--ssl-keyfile-password", "pw-canary",
        "--hicache-storage-backend-extra-config",
        '{"access_key": "ak-canary", "secret_key": "sk-canary", "hf_token": "hf-canary"}',
        "--deepep-config", "{'secret_key': 'py-canary'}", "--tp", "2",
    ]  # fmt: skip
    once = redact_launch_command(" ".join(argv))
    assert redact_text(once) == once
    assert redact_launch_command(once) == once
    for canary in ("pw-canary", "ak-canary", "sk-canary", "hf-canary", "py-canary"):
        assert canary not in once
    assert "--tp 2" in once
