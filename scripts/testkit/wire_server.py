"""The server side of the probe's wire format, for servers stood up by tests and benchmarks.

The wheel ships only the probe's side (``tools.probe.wire``: requests encoded, responses
decoded); test servers (grpcio generic handlers) and the benchmark's grpcio baseline need the
other half, built here on the same primitives.
"""

from __future__ import annotations

from sglang_sidecar_overlay.tools.probe import wire


def decode_get_server_info_request(data: bytes) -> dict:
    """Validate a ``GetServerInfoRequest``; its (empty) fields as a dict.

    Not ``None``: grpcio servers read a ``None`` request as a failed deserialization.
    """
    wire.iter_fields(data)
    return {}


def encode_get_server_info_response(json_info: str) -> bytes:
    """``GetServerInfoResponse { string json_info = 1; }``."""
    return wire.encode_string_field(1, json_info)


def decode_health_check_request(data: bytes) -> str:
    """The ``service`` name of a ``HealthCheckRequest``."""
    return wire.last_string(data, 1)


def encode_health_check_response(status: int) -> bytes:
    """``HealthCheckResponse { ServingStatus status = 1; }``; proto3 omits the default 0."""
    status = int(status)
    return wire.encode_varint(1 << 3) + wire.encode_varint(status) if status else b""
