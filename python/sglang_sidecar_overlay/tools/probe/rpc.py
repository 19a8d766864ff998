"""The probe's two RPCs over grpcio: ``GetServerInfo`` and ``grpc.health.v1.Health/Check``.

Messages are encoded by ``wire`` (no protobuf package); every failure becomes a one-line
``ProbeError``.
"""

from __future__ import annotations

from typing import Any

from sglang_sidecar_overlay.contract.endpoints import format_host_port
from sglang_sidecar_overlay.tools.probe import wire
from sglang_sidecar_overlay.tools.probe.report import Health, ProbeError

__all__ = ["DEFAULT_TIMEOUT", "fetch_server_info", "grpc_target", "parse_target", "read_health"]

DEFAULT_TIMEOUT = 5.0
# Server info carries every resolved server arg; be generous, it is read once.
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_CHANNEL_OPTIONS = (
    # An operator's http_proxy must not swallow a probe of a node-local port.
    ("grpc.enable_http_proxy", 0),
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
)


def parse_target(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[v6]:PORT`` or ``v6:PORT`` (last colon splits) → (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ProbeError("bad_target", f"{text!r}: expected [IPV6]:PORT")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ProbeError("bad_target", f"{text!r}: expected HOST:PORT")
    if not host:
        raise ProbeError("bad_target", f"{text!r}: the host is empty")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ProbeError("bad_target", f"{text!r}: port must be 1-65535")
    return host, int(port_text)


def grpc_target(host: str, port: int) -> str:
    """The address grpcio dials; IPv6 literals need brackets."""
    return format_host_port(host, port)


def _channel(target: str) -> Any:
    import grpc

    return grpc.insecure_channel(target, options=list(_CHANNEL_OPTIONS))


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def fetch_server_info(target: str, timeout: float = DEFAULT_TIMEOUT) -> str:
    """The ``json_info`` text of ``GetServerInfo``; ``ProbeError`` with a one-line reason."""
    import grpc

    with _channel(target) as channel:
        call = channel.unary_unary(
            wire.GET_SERVER_INFO_PATH,
            request_serializer=lambda _request: wire.encode_get_server_info_request(),
            response_deserializer=lambda data: data,
        )
        try:
            raw = call(None, timeout=timeout)
        except grpc.RpcError as exc:
            raise _rpc_problem(target, exc, timeout) from None
    try:
        return wire.decode_get_server_info_response(raw)
    except wire.WireError as exc:
        raise ProbeError(
            "bad_response", f"{target}: GetServerInfo answer is not a GetServerInfoResponse: {exc}"
        ) from None


def _rpc_problem(target: str, exc: Any, timeout: float) -> ProbeError:
    import grpc

    code = exc.code()
    details = one_line(exc.details() or "")
    if code == grpc.StatusCode.UNAVAILABLE:
        return ProbeError("unreachable", f"{target}: cannot connect ({details})")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ProbeError("timeout", f"{target}: no answer to GetServerInfo within {timeout:g}s")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return ProbeError(
            "not_sglang",
            f"{target}: not an SGLang native gRPC server "
            f"({wire.SGLANG_SERVICE}/GetServerInfo is UNIMPLEMENTED)",
        )
    return ProbeError("rpc_error", f"{target}: GetServerInfo failed: {code.name}: {details}")


def read_health(target: str, timeout: float = DEFAULT_TIMEOUT, service: str = "") -> Health:
    """``grpc.health.v1.Health/Check`` as ``{"service", "status", "detail"}`` (``absent``: none)."""
    import grpc

    with _channel(target) as channel:
        call = channel.unary_unary(
            wire.HEALTH_CHECK_PATH,
            request_serializer=wire.encode_health_check_request,
            response_deserializer=wire.decode_health_check_response,
        )
        try:
            status = call(service, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return {"service": service, "status": "absent", "detail": None}
            if code == grpc.StatusCode.NOT_FOUND:
                # The health service exists but does not know this service name.
                return {"service": service, "status": "SERVICE_UNKNOWN", "detail": None}
            return {"service": service, "status": "error", "detail": one_line(exc.details())}
        except wire.WireError as exc:
            return {"service": service, "status": "error", "detail": str(exc)}
    return {"service": service, "status": wire.status_name(status), "detail": None}
