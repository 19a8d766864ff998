"""Type stub for the Rust module ``sglang_sidecar_overlay._native`` (``make lint`` checks it
against the built module with ``mypy.stubtest``)."""

from types import TracebackType
from typing import final

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_REFLECTION_REQUESTS",
    "MAX_REFLECTION_STREAMS",
    "MetadataServer",
    "__version__",
    "build_info",
    "start_metadata_server",
]

__version__: str

DEFAULT_LIMITS: dict[str, int | float]
"""The default of every limit keyword of :func:`start_metadata_server`, by keyword."""

MAX_REFLECTION_REQUESTS: int
"""Requests one gRPC reflection stream may carry; the next is refused with RESOURCE_EXHAUSTED."""

MAX_REFLECTION_STREAMS: int
"""gRPC reflection streams open at once on one server; one more is refused with
RESOURCE_EXHAUSTED."""

@final
class MetadataServer:
    """A running follower metadata server (GetServerInfo + grpc.health.v1, and reflection)."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    def is_alive(self) -> bool: ...
    def set_serving(self, serving: bool) -> None: ...
    def shutdown(self) -> None: ...
    def __enter__(self) -> MetadataServer: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...

def start_metadata_server(
    host: str,
    port: int,
    server_info_json: str,
    *,
    max_connections: int = 256,
    handshake_timeout_s: float = 5.0,
    max_request_bytes: int = 4096,
    max_message_bytes: int = 4096,
    max_concurrent_streams: int = 100,
    max_header_list_bytes: int = 16384,
    request_timeout_s: float = 10.0,
    keepalive_interval_s: float = 30.0,
    keepalive_timeout_s: float = 10.0,
    tcp_keepalive_s: float = 60.0,
    implementation: str = "framed",
    reflection: bool = True,
) -> MetadataServer:
    """Start a follower metadata server on (host, port) answering GetServerInfo with
    ``server_info_json``; binds before returning (port 0 picks a free port).

    Every limit bounds what an unauthenticated client on the network can make this process
    hold; none can be switched off. Counts and sizes take integers from 1 to 2**30, durations
    seconds above 0 and at most 86400; anything else raises ValueError naming the keyword and
    the value. The defaults are in ``DEFAULT_LIMITS``.

    - ``max_connections``: open TCP connections, handshaking ones included; one more is
      closed as soon as it is accepted.
    - ``handshake_timeout_s``: a connection that has not sent the HTTP/2 client preface by
      then is closed (garbage, HTTP/1.1 and slow clients never reach the HTTP/2 stack).
    - ``max_request_bytes``: total bytes of a GetServerInfo request body (its message is
      empty); a larger body is refused with RESOURCE_EXHAUSTED without reading the rest.
    - ``max_message_bytes``: largest gRPC message any service decodes (GetServerInfo and
      grpc.health.v1); larger is refused as soon as its 5-byte header arrives.
    - ``max_concurrent_streams``: HTTP/2 streams (calls, health watches) per connection.
    - ``max_header_list_bytes``: HTTP/2 header list size; larger requests are refused.
    - ``request_timeout_s``: longest a call may take to be answered.
    - ``keepalive_interval_s`` / ``keepalive_timeout_s``: an HTTP/2 PING is sent that often
      and the connection closed if it is not acknowledged in time.
    - ``tcp_keepalive_s``: TCP keepalive idle time (then 4 probes, ``tcp_keepalive_s / 4``
      apart, at least 1 s), so peers that vanished are reaped; set in whole seconds clamped
      to 1..32767, the range Linux takes.

    ``implementation`` picks how GetServerInfo is served, ``"framed"`` (the reply framed once,
    handed out without a copy) or ``"generated"`` (tonic's generated server); both answer the
    same, and the benchmark compares them.

    ``reflection`` serves gRPC server reflection (``grpc.reflection.v1`` and ``v1alpha``) over
    exactly the served services, so ``grpcurl -plaintext HOST:PORT list`` and ``describe``
    work; it reveals their schema and nothing else. At most ``MAX_REFLECTION_STREAMS``
    reflection streams are open at once, and each is answered for at most
    ``MAX_REFLECTION_REQUESTS`` requests of at most ``max_message_bytes`` each; beyond either,
    RESOURCE_EXHAUSTED. ``False`` leaves reflection calls UNIMPLEMENTED; anything
    but a bool raises ValueError.
    """

def build_info() -> dict[str, object]: ...
