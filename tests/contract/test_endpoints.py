"""The endpoint grammar (``contract.endpoints``): how a bound publisher's address is advertised
(``normalize_endpoint``), what a served endpoint must look like (``endpoint_problems``), and
that the JSON Schema's endpoint definition says the same thing.
"""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_sidecar_overlay.contract.endpoints import endpoint_problems, normalize_endpoint
from sglang_sidecar_overlay.contract.schema import contract_validator, load_schema

# --- advertising a bound address ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("tcp://*:5557", "tcp://127.0.0.1:5557"),
        ("tcp://0.0.0.0:5557", "tcp://127.0.0.1:5557"),
        ("tcp://[::]:5557", "tcp://[::1]:5557"),
        ("tcp://:::5557", "tcp://[::1]:5557"),
        ("tcp://::1:5557", "tcp://[::1]:5557"),
        ("tcp://10.0.0.7:5557", "tcp://10.0.0.7:5557"),
        ("tcp://node-3.cluster:5557", "tcp://node-3.cluster:5557"),
        ("tcp://[fe80::1%eth0]:5557", "tcp://[fe80::1%eth0]:5557"),
        ("ipc:///run/kv.sock", "ipc:///run/kv.sock"),
        ("ipc://@kv", "ipc://@kv"),
        ("tcp://*:0", None),
        ("tcp://*:65536", None),
        ("tcp://*:-1", None),
        ("tcp://*", None),
        ("tcp://:5557", None),
        ("tcp://user@host:5557", None),
        ("tcp://host/path:5557", None),
        ("tcp://10.0.0.1;10.0.0.2:5557", None),
        ("tcp://[zz]:5557", None),
        ("ipc://*", None),
        ("ipc://", None),
        ("inproc://kv", None),
        ("udp://*:5557", None),
        (None, None),
    ],
)
def test_normalize_endpoint_table(endpoint, expected):
    assert normalize_endpoint(endpoint) == expected


HOSTS = st.one_of(
    st.sampled_from(
        [
            "*",
            "0.0.0.0",
            "::",
            "[::]",
            "[0:0:0:0:0:0:0:0]",
            "[::ffff:0.0.0.0]",
            "127.0.0.1",
            "[::1]",
            "::1",
            "localhost",
            "node-7.cluster",
            "[fe80::1%eth0]",
            "",
            "[]",
        ]
    ),
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda address: f"[{address}]"),
    st.text(max_size=12),
)
PORTS = st.one_of(st.integers(-2, 70000).map(str), st.text(max_size=6))
TCP = st.builds(lambda host, port: f"tcp://{host}:{port}", HOSTS, PORTS)
IPC = st.builds(
    lambda path: f"ipc://{path}",
    st.one_of(st.sampled_from(["@kv", "@", "*", "", "a.sock", "../x/y.sock", "/abs"]), st.text()),
)
ENDPOINTS = st.one_of(TCP, IPC, st.text(), st.sampled_from(["inproc://x", "udp://*:1"]))


def _is_wildcard_host(host: str) -> bool:
    if host in ("*", "0.0.0.0"):
        return True
    literal = host[1:-1].partition("%")[0] if host.startswith("[") else host
    try:
        address = ipaddress.ip_address(literal)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_unspecified or (mapped is not None and mapped.is_unspecified)


@settings(max_examples=400)
@given(ENDPOINTS)
def test_normalize_is_idempotent_and_never_advertises_a_wildcard(endpoint):
    normalized = normalize_endpoint(endpoint)
    if normalized is None:
        return
    assert normalize_endpoint(normalized) == normalized
    if normalized.startswith("tcp://"):
        host, _, port = normalized[len("tcp://") :].rpartition(":")
        assert not _is_wildcard_host(host)
        assert 0 < int(port) < 65536
    else:
        path = normalized[len("ipc://") :]
        assert path.startswith(("/", "@")) and path != "@"


# --- what a served endpoint must look like --------------------------------------------------------


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://127.0.0.1:5557",
        "tcp://[::1]:5557",
        "tcp://node-3.cluster:1",
        "ipc:///tmp/a",
        "ipc://@x",
    ],
)
def test_check_endpoint_accepts(endpoint: str) -> None:
    assert endpoint_problems(endpoint) == []


@pytest.mark.parametrize(
    ("endpoint", "words"),
    [
        ("tcp://*:5557", "wildcard"),
        ("tcp://0.0.0.0:5557", "wildcard"),
        ("tcp://[::]:5557", "wildcard"),
        ("tcp://127.0.0.1:0", "port"),
        ("tcp://::1:5557", "bracketed"),
        ("tcp://user@host:1", "no user"),
        ("ipc://relative.sock", "absolute"),
        ("inproc://events", "inproc"),
        ("udp://host:1", "transport"),
        (None, "non-empty string"),
    ],
)
def test_check_endpoint_rejects(endpoint: object, words: str) -> None:
    problems = endpoint_problems(endpoint)
    assert len(problems) == 1 and words in problems[0]


# --- never raising, and the schema saying the same ------------------------------------------------

ENDPOINT_TEXT = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda scheme, rest: scheme + rest,
        st.sampled_from(["tcp://", "ipc://", "inproc://", "TCP://", "tcp:/", ""]),
        st.text(alphabet="0123456789abcdef:.[]*%@/-_ \x00", max_size=30),
    ),
    st.builds(
        lambda host, port: f"tcp://{host}:{port}",
        st.sampled_from(["*", "0.0.0.0", "[::]", "::", "[::1]", "h", "[fe80::1%eth0]", "a b"]),
        st.integers(-5, 70000),
    ),
)


@settings(max_examples=1000, deadline=None)
@given(ENDPOINT_TEXT)
def test_normalize_never_raises_is_idempotent_and_dialable(text: str) -> None:
    normalized = normalize_endpoint(text)
    if normalized is None:
        return
    assert normalize_endpoint(normalized) == normalized
    assert endpoint_problems(normalized) == []


@settings(max_examples=500, deadline=None)
@given(st.one_of(ENDPOINT_TEXT, st.integers(), st.none(), st.lists(st.text(), max_size=2)))
def test_endpoint_problems_never_raises(value: object) -> None:
    problems = endpoint_problems(value)
    assert isinstance(problems, list)
    assert all(isinstance(problem, str) for problem in problems)


# The schema's endpoint definition as the probe validates it, and its portable patterns alone.
ENDPOINT_VALIDATOR = contract_validator(
    {"$defs": load_schema()["$defs"], "$ref": "#/$defs/endpoint"}
)
PORTABLE_PATTERNS = [
    re.compile(branch["pattern"]) for branch in load_schema()["$defs"]["endpoint"]["anyOf"]
]
ADVERTISABLE = st.one_of(
    st.builds(
        lambda address, port: f"tcp://[{address}]:{port}",
        st.ip_addresses(v=6).map(str),
        st.integers(-1, 70000),
    ),
    st.builds(
        lambda address, port: f"tcp://{address}:{port}",
        st.ip_addresses(v=4).map(str),
        st.integers(-1, 70000),
    ),
    st.builds(lambda path: "ipc://" + path, st.text(alphabet="/.a@\n\x00 ", max_size=10)),
    st.builds(
        lambda host, zone, port: f"tcp://[{host}%{zone}]:{port}",
        st.sampled_from(["fe80::1", "::", "1:2", "::ffff:0.0.0.0", "::1"]),
        st.text(alphabet="ab0.-_%", max_size=4),
        st.integers(0, 70000),
    ),
)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(ENDPOINT_TEXT, ADVERTISABLE))
def test_schema_endpoint_grammar_is_endpoint_problems(text: str) -> None:
    # One rule: the schema (patterns + format) accepts exactly what endpoint_problems accepts,
    # and the portable patterns alone never reject a dialable endpoint.
    dialable = endpoint_problems(text) == []
    assert ENDPOINT_VALIDATOR.is_valid(text) == dialable
    if dialable:
        assert any(pattern.search(text) for pattern in PORTABLE_PATTERNS)


@pytest.mark.parametrize(
    ("endpoint", "dialable"),
    [
        ("tcp://127.0.0.1:5557", True),
        ("tcp://[::1]:5557", True),
        ("tcp://[fe80::1%eth0]:1", True),
        ("tcp://[::ffff:10.0.0.1]:65535", True),
        ("tcp://node-3.cluster:1", True),
        ("ipc:///tmp/a", True),
        ("ipc:///", True),
        ("ipc://@x", True),
        ("tcp://*:5557", False),
        ("tcp://0.0.0.0:5557", False),
        ("tcp://[::]:5557", False),
        ("tcp://[::0]:5557", False),
        ("tcp://[::ffff:0.0.0.0]:5557", False),
        ("tcp://[1:2]:5557", False),
        ("tcp://[fe80::1%]:5557", False),
        ("tcp://h:0", False),
        ("tcp://h:05", False),
        ("tcp://h:65536", False),
        ("tcp://h:5\n", False),
        ("tcp://::1:5557", False),
        ("tcp://user@h:1", False),
        ("ipc://rel.sock", False),
        ("ipc:///a/../b", False),
        ("ipc:///a/", False),
        ("ipc://@", False),
        ("inproc://events", False),
        ("udp://h:1", False),
    ],
)
def test_schema_and_endpoint_problems_agree_on_a_table(endpoint: str, dialable: bool) -> None:
    assert (endpoint_problems(endpoint) == []) is dialable
    assert ENDPOINT_VALIDATOR.is_valid(endpoint) is dialable
