"""Hand-rolled protobuf wire format for the few tiny messages the probe exchanges (client side).

The runtime dependencies stop at grpcio: no protobuf package and no generated code. The
messages involved have at most one scalar field each, so encoding them by hand is shorter
than any code generator and keeps ``probe`` importable on a bare SGLang image. The method
paths below are the only place the package writes them.

Messages covered (field numbers are part of the upstream contract); the probe encodes the
requests and decodes the responses:

- ``sglang.runtime.v1.GetServerInfoRequest {}``
- ``sglang.runtime.v1.GetServerInfoResponse { string json_info = 1; }``
- ``grpc.health.v1.HealthCheckRequest { string service = 1; }``
- ``grpc.health.v1.HealthCheckResponse { ServingStatus status = 1; }``

Decoders skip unknown fields, as protobuf requires, so a newer server that adds fields
still decodes here.
"""

from __future__ import annotations

import enum

SGLANG_SERVICE = "sglang.runtime.v1.SglangService"
GET_SERVER_INFO_PATH = f"/{SGLANG_SERVICE}/GetServerInfo"

HEALTH_SERVICE = "grpc.health.v1.Health"
HEALTH_CHECK_PATH = f"/{HEALTH_SERVICE}/Check"
HEALTH_WATCH_PATH = f"/{HEALTH_SERVICE}/Watch"

# Wire types (protobuf encoding spec).
_VARINT = 0
_FIXED64 = 1
_LENGTH_DELIMITED = 2
_FIXED32 = 5


class WireError(ValueError):
    """Bytes that are not a valid encoding of the expected message."""


class ServingStatus(enum.IntEnum):
    """``grpc.health.v1.HealthCheckResponse.ServingStatus``."""

    UNKNOWN = 0
    SERVING = 1
    NOT_SERVING = 2
    SERVICE_UNKNOWN = 3


def encode_varint(value: int) -> bytes:
    """Base-128 varint; negative numbers use the 10-byte two's complement form."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(data: bytes, pos: int) -> tuple[int, int]:
    """Decode a varint at ``pos``; returns (value, next position)."""
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def iter_fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """Split a message into (field number, wire type, value) triples, in wire order."""
    fields: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = decode_varint(data, pos)
        number, wire_type = key >> 3, key & 0x07
        if number == 0:
            raise WireError("field number 0 is invalid")
        value: int | bytes
        if wire_type == _VARINT:
            value, pos = decode_varint(data, pos)
        elif wire_type == _LENGTH_DELIMITED:
            length, pos = decode_varint(data, pos)
            if pos + length > len(data):
                raise WireError("truncated length-delimited field")
            value = bytes(data[pos : pos + length])
            pos += length
        elif wire_type == _FIXED64:
            if pos + 8 > len(data):
                raise WireError("truncated fixed64 field")
            value = bytes(data[pos : pos + 8])
            pos += 8
        elif wire_type == _FIXED32:
            if pos + 4 > len(data):
                raise WireError("truncated fixed32 field")
            value = bytes(data[pos : pos + 4])
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire_type}")
        fields.append((number, wire_type, value))
    return fields


def encode_string_field(number: int, text: str) -> bytes:
    # proto3 omits a scalar field that holds its default value.
    if not text:
        return b""
    raw = text.encode("utf-8")
    return encode_varint(number << 3 | _LENGTH_DELIMITED) + encode_varint(len(raw)) + raw


def last_string(data: bytes, number: int) -> str:
    """The string field ``number`` of a message; the last occurrence wins (protobuf merge)."""
    text = ""
    for field, wire_type, value in iter_fields(data):
        if field != number:
            continue
        if wire_type != _LENGTH_DELIMITED or not isinstance(value, bytes):
            raise WireError(f"field {number} is not length-delimited")
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireError(f"field {number} is not valid UTF-8") from exc
    return text


def last_varint(data: bytes, number: int) -> int:
    """The varint field ``number`` of a message; the last occurrence wins (protobuf merge)."""
    result = 0
    for field, wire_type, value in iter_fields(data):
        if field != number:
            continue
        if wire_type != _VARINT or not isinstance(value, int):
            raise WireError(f"field {number} is not a varint")
        result = value
    return result


def encode_get_server_info_request() -> bytes:
    """``GetServerInfoRequest {}`` has no fields: the empty byte string."""
    return b""


def decode_get_server_info_response(data: bytes) -> str:
    """The ``json_info`` string of a ``GetServerInfoResponse``."""
    return last_string(data, 1)


def encode_health_check_request(service: str = "") -> bytes:
    """``HealthCheckRequest { string service = 1; }``; ``""`` asks about the whole server."""
    return encode_string_field(1, service)


def decode_health_check_response(data: bytes) -> int:
    """The raw status number; unknown values are kept so callers can report them."""
    return last_varint(data, 1)


def status_name(status: int) -> str:
    """``SERVING`` etc., or ``UNRECOGNIZED(7)`` for a value this module does not know."""
    try:
        return ServingStatus(status).name
    except ValueError:
        return f"UNRECOGNIZED({status})"
