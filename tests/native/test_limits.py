"""The limit keywords of ``_native.start_metadata_server``: defaults, validation, effect.

Each limit's behaviour under load is tested in Rust (``rust/native/tests/limits.rs``) and under
hostile clients in ``test_hostile_input.py``; here, what a Python caller sees.
"""

from __future__ import annotations

import ast
import re
import socket
import time

import pytest
from conftest import ROOT
from sglang_sidecar_overlay import _native
from sglang_sidecar_overlay._native import DEFAULT_LIMITS, start_metadata_server
from sglang_sidecar_overlay.tools.probe import wire

STUB = ROOT / "python" / "sglang_sidecar_overlay" / "_native.pyi"
SECURITY_DOC = ROOT / "docs" / "security.md"
INT_LIMITS = [k for k in DEFAULT_LIMITS if not k.endswith("_s")]
SECONDS_LIMITS = [k for k in DEFAULT_LIMITS if k.endswith("_s")]


def stub_function() -> ast.FunctionDef:
    tree = ast.parse(STUB.read_text())
    return next(
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "start_metadata_server"
    )


def stub_limits() -> dict[str, tuple[str, object]]:
    """The stub's limit keywords in order (not ``implementation``, ``reflection``): their
    annotation and default."""
    func = stub_function()
    return {
        arg.arg: (ast.unparse(arg.annotation) if arg.annotation else "", ast.literal_eval(default))
        for arg, default in zip(func.args.kwonlyargs, func.args.kw_defaults, strict=True)
        if default is not None and arg.arg not in ("implementation", "reflection")
    }


def stub_defaults() -> dict[str, object]:
    return {keyword: default for keyword, (_, default) in stub_limits().items()}


def test_the_stub_and_the_security_doc_state_the_module_defaults() -> None:
    assert stub_defaults() == DEFAULT_LIMITS
    rows = dict(re.findall(r"^\| `(\w+)` \| ([\d.]+) \|", SECURITY_DOC.read_text(), re.M))
    assert {k: float(v) for k, v in rows.items()} == {
        k: float(v) for k, v in DEFAULT_LIMITS.items()
    }


def test_the_stub_and_the_security_doc_follow_the_module_table() -> None:
    # The module's table (rust/native/src/limits.rs) is the order, the kinds and the keywords;
    # the stub's signature, its docstring and the doc's table must say the same.
    table = list(DEFAULT_LIMITS)
    limits = stub_limits()
    assert list(limits) == table
    for keyword, (annotation, _) in limits.items():
        assert annotation == type(DEFAULT_LIMITS[keyword]).__name__, keyword
    docstring = ast.get_docstring(stub_function()) or ""
    for keyword in table:
        assert f"``{keyword}``" in docstring, f"the stub's docstring does not describe {keyword}"
    doc_rows = re.findall(r"^\| `(\w+)` \| [\d.]+ \|", SECURITY_DOC.read_text(), re.M)
    assert doc_rows == table


def test_an_unknown_keyword_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_bogus'"):
        start_metadata_server("127.0.0.1", 0, "{}", max_bogus=1)  # type: ignore[call-arg]


def test_every_limit_is_bounded_by_default() -> None:
    assert DEFAULT_LIMITS["max_connections"] >= 1
    assert all(value > 0 for value in DEFAULT_LIMITS.values())
    assert set(DEFAULT_LIMITS) == set(stub_defaults())


@pytest.mark.parametrize("keyword", INT_LIMITS)
@pytest.mark.parametrize("bad", [0, -1, 2**31, 1.5, "8", True])
def test_bad_integer_limits_raise_value_error_naming_keyword_and_value(
    keyword: str, bad: object
) -> None:
    with pytest.raises(ValueError, match=rf"^{keyword}={re.escape(repr(bad))} is invalid"):
        start_metadata_server("127.0.0.1", 0, "{}", **{keyword: bad})


@pytest.mark.parametrize("keyword", SECONDS_LIMITS)
@pytest.mark.parametrize("bad", [0, -0.5, float("nan"), float("inf"), 86_401, "1", False])
def test_bad_durations_raise_value_error_naming_keyword_and_value(
    keyword: str, bad: object
) -> None:
    with pytest.raises(ValueError, match=rf"^{keyword}={re.escape(repr(bad))} is invalid"):
        start_metadata_server("127.0.0.1", 0, "{}", **{keyword: bad})


def test_limits_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        start_metadata_server("127.0.0.1", 0, "{}", 10)  # type: ignore[misc]


def test_every_limit_accepts_a_valid_value() -> None:
    values = {k: (7 if k in INT_LIMITS else 2.5) for k in DEFAULT_LIMITS}
    values["max_request_bytes"] = values["max_message_bytes"] = 1024
    with start_metadata_server("127.0.0.1", 0, "{}", **values) as server:
        assert server.is_alive()


def wait_closed(sock: socket.socket, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(4096):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True
    return False


def test_handshake_timeout_keyword_takes_effect() -> None:
    with (
        start_metadata_server("127.0.0.1", 0, "{}", handshake_timeout_s=0.2) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as silent,
    ):
        assert wait_closed(silent, timeout=20)


def test_max_connections_keyword_takes_effect() -> None:
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
    with (
        start_metadata_server("127.0.0.1", 0, "{}", max_connections=1) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as first,
    ):
        first.sendall(preface)
        first.settimeout(20)
        assert first.recv(9)  # the server's SETTINGS: this one holds the only slot
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as second:
            second.sendall(preface)
            assert wait_closed(second, timeout=20)


def test_the_module_exports_its_defaults() -> None:
    assert _native.DEFAULT_LIMITS is DEFAULT_LIMITS
    assert isinstance(DEFAULT_LIMITS["max_connections"], int)
    assert isinstance(DEFAULT_LIMITS["handshake_timeout_s"], float)


def test_an_unknown_implementation_raises_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"^implementation='nope' is invalid"):
        start_metadata_server("127.0.0.1", 0, "{}", implementation="nope")


@pytest.mark.parametrize("implementation", ["framed", "generated"])
def test_both_implementations_answer_with_the_snapshot(implementation: str) -> None:
    import grpc

    snapshot = '{"node_rank": 1, "pad": "' + "x" * 70_000 + '"}'
    with (
        start_metadata_server("127.0.0.1", 0, snapshot, implementation=implementation) as server,
        grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        raw = channel.unary_unary(wire.GET_SERVER_INFO_PATH)(b"", timeout=10)
    # GetServerInfoResponse: field 1, length-delimited, then the JSON text.
    assert raw.endswith(snapshot.encode())
    assert raw[0] == 0x0A
