"""The endpoint grammar: what a node advertises and how a local consumer dials it.

One home for every address rule of the contract, used by the source builder (publisher side),
the sidecar supervisor (the URL it hands a sidecar), the probe (what a consumer can dial) and
the adapters (which publisher endpoints SGLang binds). Pure functions, no SGLang import.

- A bound ZMQ endpoint is advertised in the form another process on the node can connect to:
  wildcard hosts become loopback (``*``, ``0.0.0.0`` → ``127.0.0.1``; ``::`` → ``[::1]``),
  IPv6 literals are bracketed, ``ipc://`` paths are absolute (``@name`` abstract sockets kept).
- ``inproc://``, connect-style publishers (nothing bound) and anything unparsable are never
  advertised.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Any

__all__ = [
    "IPV4_LOOPBACK",
    "IPV6_LOOPBACK",
    "endpoint_problems",
    "format_host_port",
    "is_bind_endpoint",
    "loopback_for",
    "normalize_endpoint",
]

TCP = "tcp://"
IPC = "ipc://"
INPROC = "inproc://"
IPV4_LOOPBACK = "127.0.0.1"
IPV6_LOOPBACK = "::1"
# Hosts a socket can bind but nobody can dial.
_IPV4_WILDCARDS = frozenset({"", "*", "0.0.0.0"})
_IPV6_WILDCARDS = frozenset({"::", "[::]"})
# DNS names and IPv4 literals; anything else (paths, credentials, ZMQ "src;dst") is refused.
_HOSTNAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_PORT = re.compile(r"^[0-9]{1,5}$")


def format_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 literal bracketed (``[::1]:50051``)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def loopback_for(host: str) -> str:
    """The host a process on this node dials to reach a listener bound to ``host``.

    Wildcards become loopback of the same family; a concrete host is kept (unbracketed).
    """
    bare = host.strip()
    if bare in _IPV6_WILDCARDS:
        return IPV6_LOOPBACK
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    return IPV4_LOOPBACK if bare in _IPV4_WILDCARDS else bare


def is_bind_endpoint(endpoint: str) -> bool:
    """Whether a ZMQ publisher binds ``endpoint`` (else it connects), as SGLang decides it."""
    return (
        "*" in endpoint
        or "::" in endpoint
        or "0.0.0.0" in endpoint
        or endpoint.startswith((IPC, INPROC))
    )


def normalize_endpoint(endpoint: str | None) -> str | None:
    """The form of a bound ZMQ endpoint another local process can connect to.

    ``None`` when nothing local can subscribe: no endpoint (connect-style publisher),
    ``inproc://``, other transports, unparsable or out-of-range TCP addresses.
    """
    if endpoint is None:
        return None
    if endpoint.startswith(TCP):
        return _normalize_tcp(endpoint[len(TCP) :])
    if endpoint.startswith(IPC):
        return _normalize_ipc(endpoint[len(IPC) :])
    return None


def _normalize_tcp(address: str) -> str | None:
    host, sep, port_text = address.rpartition(":")
    if not sep or not _PORT.fullmatch(port_text):
        return None
    port = int(port_text)
    if not 0 < port < 65536:
        return None
    advertised = _advertisable_host(host)
    if advertised is None:
        return None
    return f"{TCP}{advertised}:{port}"


def _advertisable_host(host: str) -> str | None:
    """Wildcards become loopback; IPv6 literals come back bracketed; concrete hosts stay."""
    if host == "*":
        return IPV4_LOOPBACK
    bracketed = host.startswith("[") and host.endswith("]")
    literal = host[1:-1] if bracketed else host
    if ":" in literal:
        return _advertisable_ipv6(literal)
    if bracketed or not _HOSTNAME.fullmatch(literal):
        return None
    if literal == "0.0.0.0":
        return IPV4_LOOPBACK
    return literal


def _advertisable_ipv6(literal: str) -> str | None:
    address, percent, zone = literal.partition("%")
    try:
        parsed = ipaddress.IPv6Address(address)
    except ValueError:
        return None
    if percent and not _HOSTNAME.fullmatch(zone):
        # A zone is an interface name; "%" with nothing after it names none.
        return None
    mapped = parsed.ipv4_mapped
    if parsed.is_unspecified or (mapped is not None and mapped.is_unspecified):
        return f"[{IPV6_LOOPBACK}]"
    return f"[{literal}]"


def _normalize_ipc(path: str) -> str | None:
    # "*" asks ZMQ to pick a temporary path; only the path read back after bind is usable.
    if not path or path == "*" or "\x00" in path:
        return None
    if path.startswith("@"):
        # Abstract socket names live in a kernel namespace, not the filesystem.
        return f"{IPC}{path}" if len(path) > 1 else None
    return f"{IPC}{os.path.abspath(path)}"


def endpoint_problems(endpoint: Any) -> list[str]:
    """Why a consumer could not dial ``endpoint`` as advertised (empty list: it can).

    An endpoint is fine exactly when it is already in advertised form
    (``normalize_endpoint(endpoint) == endpoint``); the messages say what is wrong.
    """
    if not isinstance(endpoint, str) or not endpoint:
        return [f"must be a non-empty string, got {endpoint!r}"]
    if endpoint.startswith(INPROC):
        return [f"{endpoint} is process-local (inproc); no other process can subscribe"]
    if endpoint.startswith(IPC):
        path = endpoint[len(IPC) :]
        if not path.startswith(("/", "@")) or path == "@":
            return [f"{endpoint}: ipc path must be absolute (or an @abstract name)"]
    elif endpoint.startswith(TCP):
        problem = _tcp_problem(endpoint)
        if problem is not None:
            return [problem]
    else:
        return [f"{endpoint}: unsupported transport; expected tcp:// or ipc://"]
    advertised = normalize_endpoint(endpoint)
    if advertised != endpoint:
        hint = f"; advertise {advertised}" if advertised else ""
        return [f"{endpoint}: not in advertised form{hint}"]
    return []


def _tcp_problem(endpoint: str) -> str | None:
    address = endpoint[len(TCP) :]
    if any(mark in address for mark in "@/?#;"):
        return f"{endpoint}: must be tcp://HOST:PORT (no user, path, query or source address)"
    if address.startswith("["):
        host, sep, rest = address.partition("]")
        host += sep
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = address.rpartition(":")
        if ":" in host:
            return f"{endpoint}: an IPv6 host must be bracketed, tcp://[ADDR]:PORT"
    if host in _IPV4_WILDCARDS or host in _IPV6_WILDCARDS:
        return (
            f"{endpoint}: wildcard bind address, not dialable; "
            "advertise the bound address (127.0.0.1 / [::1] for wildcard binds)"
        )
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return f"{endpoint}: port must be 1-65535"
    return None
