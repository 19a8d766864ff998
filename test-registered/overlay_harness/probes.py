"""Clients a test points at a node: gRPC, HTTP, TCP and ZMQ, each returning plain JSON values.

A node of a multi-node group is its own host, reachable only from inside it, so these run
where the node is: ``Node.inside(function, ...)`` calls them in the test process for a node on
the test's own host, or through ``overlay_harness.inside`` in the node's namespace. Bytes come
back as hex strings for that reason.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import zmq
from sglang_sidecar_overlay.contract.events import REPLAY_END_SEQ, decode_seq, encode_seq
from sglang_sidecar_overlay.tools.probe import wire

SERVING, NOT_SERVING = 1, 2


def _raw(channel: grpc.Channel, path: str) -> Any:
    return channel.unary_unary(
        path, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )


def server_info_text(port: int, host: str) -> str:
    """The JSON text of the native gRPC ``GetServerInfo`` reply, as served."""
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        reply = _raw(channel, wire.GET_SERVER_INFO_PATH)(
            wire.encode_get_server_info_request(), timeout=30.0
        )
    return wire.decode_get_server_info_response(reply)


def get_server_info(port: int, host: str) -> dict:
    return json.loads(server_info_text(port, host))


def health_or_error(port: int, host: str) -> int | str:
    """grpc.health.v1 status of the whole server, or the gRPC status name of the failed Check
    (``UNAVAILABLE`` when nothing answers)."""
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            reply = _raw(channel, wire.HEALTH_CHECK_PATH)(
                wire.encode_health_check_request(""), timeout=5.0
            )
        except grpc.RpcError as exc:
            return exc.code().name
    return wire.decode_health_check_response(reply)


def health(port: int, host: str) -> int | None:
    """grpc.health.v1 status of the whole server; None only when nothing listens (the
    connection is refused: ``UNAVAILABLE``). Any other failed Check (``UNIMPLEMENTED`` from a
    server without the health service, a deadline) is an AssertionError naming it, so it
    never passes for "nothing"."""
    status = health_or_error(port, host)
    if isinstance(status, int):
        return status
    if status == "UNAVAILABLE":
        return None
    raise AssertionError(f"health Check on {host}:{port} failed with {status}, not refused")


def watch_health(port: int, host: str) -> Iterator[int]:
    """Every status of a grpc.health.v1 Watch stream, the current one first, until it ends."""
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        watch = channel.unary_stream(
            wire.HEALTH_WATCH_PATH,
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        stream = watch(wire.encode_health_check_request(""), timeout=120.0)
        try:
            for reply in stream:
                yield wire.decode_health_check_response(reply)
        except grpc.RpcError:
            return


def http_text(port: int, host: str, path: str, tls: bool = False) -> list:
    """``[status, body text]`` of ``GET path``; with ``tls`` over HTTPS, the certificate not
    verified (tests serve a throwaway one)."""
    scheme = "https" if tls else "http"
    context = ssl._create_unverified_context() if tls else None
    url = f"{scheme}://{host}:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=60, context=context) as reply:
            return [reply.status, reply.read().decode()]
    except urllib.error.HTTPError as exc:
        return [exc.code, exc.read().decode(errors="replace")]


def post_json(url: str, body: dict, seconds: float) -> dict:
    """The JSON reply of a ``POST`` of ``body`` as JSON (an HTTP error status raises)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=seconds) as reply:
        return json.loads(reply.read())


def generate(
    port: int,
    host: str,
    input_ids: list[int],
    max_new_tokens: int,
    dp_rank: int | None,
    seconds: float = 120.0,
) -> dict:
    """``meta_info`` of a real ``POST /generate`` (token ids in, greedy, EOS ignored so the
    output length is fixed), pinned to ``dp_rank`` (SGLang's ``routed_dp_rank``) when given."""
    body: dict = {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                            "ignore_eos": True},
    }  # fmt: skip
    if dp_rank is not None:
        body["routed_dp_rank"] = dp_rank
    try:
        return post_json(f"http://{host}:{port}/generate", body, seconds)["meta_info"]
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"/generate: {exc.code} {exc.read()[:2000]!r}") from None


def tcp_listening(port: int) -> bool:
    """Whether any socket of this host (this network namespace) listens on TCP ``port``."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                return True
    return False


def tcp_connect_error(endpoint: str) -> str | None:
    """None when a TCP connection to ``tcp://host:port`` is accepted, else the error."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5.0):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def _seq(raw: bytes, endpoint: str) -> int:
    """The sequence number of a frame; an AssertionError when it is not one."""
    number = decode_seq(raw)
    if number is None:
        raise AssertionError(f"sequence frame {raw!r} from {endpoint} is not 8 bytes")
    return number


def _receive_before(sock: zmq.Socket, deadline: float, failure: Callable[[], str]) -> list:
    """The socket's next multipart message, or ``AssertionError(failure())`` at ``deadline``."""
    while (remaining := deadline - time.monotonic()) > 0:
        if sock.poll(timeout=min(remaining, 1.0) * 1000):
            return sock.recv_multipart()
    raise AssertionError(failure())


def live_batches(endpoint: str, topic: str, count: int, min_seq: int, seconds: float) -> list:
    """``[[seq, payload hex]]`` of the first ``count`` live batches numbered ``min_seq`` or more
    that a SUB socket receives from ``endpoint`` (it may join before the first is published);
    raises when they do not all come within ``seconds``."""
    with zmq.Context() as context, context.socket(zmq.SUB) as sub:
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        sub.connect(endpoint)
        seen: dict[int, str] = {}
        deadline = time.monotonic() + seconds
        while len(seen) < count:
            got_topic, seq, payload = _receive_before(
                sub,
                deadline,
                lambda: f"{len(seen)} live batch(es) from {endpoint} within {seconds:.0f} s",
            )
            if got_topic != topic.encode():
                raise AssertionError(f"live topic {got_topic!r} on {endpoint}")
            number = _seq(seq, endpoint)
            if number >= min_seq:
                seen[number] = payload.hex()
        return sorted([seq, payload] for seq, payload in seen.items())


def kv_batches(endpoint: str, topic: str, seconds: float) -> Iterator[Any]:
    """``"subscribed"`` once a SUB socket is connected to ``endpoint``, then ``[seq, payload
    hex]`` of every live batch as it comes, for ``seconds`` (or until the reader goes away)."""
    with zmq.Context() as context, context.socket(zmq.SUB) as sub:
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        sub.connect(endpoint)
        yield "subscribed"
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if sub.poll(timeout=min(remaining, 1.0) * 1000):
                got_topic, seq, payload = sub.recv_multipart()
                if got_topic != topic.encode():
                    raise AssertionError(f"live topic {got_topic!r} on {endpoint}")
                yield [_seq(seq, endpoint), payload.hex()]


def replay(endpoint: str, start: int, seconds: float) -> list:
    """``[[topic or None, seq, payload hex]]`` a DEALER gets back from a publisher's replay
    ROUTER for ``start``, up to the end marker. Before SGLang 0.5.22 a replayed message has no
    topic frame."""
    with zmq.Context() as context, context.socket(zmq.DEALER) as dealer:
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(endpoint)
        # The ROUTER reads [identity, "", start]; a DEALER adds no delimiter of its own.
        dealer.send_multipart([b"", encode_seq(start)])
        replayed: list = []
        deadline = time.monotonic() + seconds
        while True:
            frames = _receive_before(
                dealer,
                deadline,
                lambda: f"no end marker from {endpoint} within {seconds:.0f} s "
                f"({len(replayed)} batch(es) replayed)",
            )
            if frames[0] != b"":
                raise AssertionError(f"replay message without its delimiter: {frames}")
            if len(frames) == 4:
                topic, seq, payload = frames[1:]
            elif len(frames) == 3:
                topic, (seq, payload) = None, frames[1:]
            else:
                raise AssertionError(f"replay message of {len(frames)} frames: {frames}")
            number = _seq(seq, endpoint)
            if number == REPLAY_END_SEQ:
                return replayed
            replayed.append([topic.decode() if topic is not None else None, number, payload.hex()])


def hold_port(host: str, port: int) -> Iterator[str]:
    """Bind and listen on ``host:port``; yields once bound, holds it until stdin closes."""
    with socket.socket() as taken:
        taken.bind((host, port))
        taken.listen()
        yield "bound"
        sys.stdin.read()


def serve_reply(json_info: str, host: str) -> Iterator[int]:
    """A metadata server of the overlay's (the native one) on ``host`` serving ``json_info``
    as ``GetServerInfo``: yields its port, serves until stdin closes (the test's end)."""
    from sglang_sidecar_overlay import _native

    server = _native.start_metadata_server(host, 0, json_info)
    try:
        yield server.port
        sys.stdin.read()
    finally:
        server.shutdown()


# --- upstream's WatchEngineState (0.5.23's native gRPC), read from the protobuf wire format ---

WATCH_ENGINE_STATE_PATH = "/sglang.runtime.v1.SglangService/WatchEngineState"
# EngineStateSnapshot fields: instance_id, revision, server_info (a GetServerInfoResponse).
SNAPSHOT_INSTANCE_ID, SNAPSHOT_REVISION, SNAPSHOT_SERVER_INFO = 1, 2, 6


def protobuf_fields(data: bytes) -> dict[int, Any]:
    """``{field number: value}`` of a message's varint, fixed and length-delimited fields
    (the probe's decoder; the last occurrence of a field wins)."""
    return {number: value for number, _wire_type, value in wire.iter_fields(data)}


def engine_state(port: int, host: str) -> dict:
    """The first ``WatchEngineState`` snapshot (the current state): its instance id, revision
    and the server info it embeds."""
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        watch = channel.unary_stream(
            WATCH_ENGINE_STATE_PATH,
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        stream = watch(b"", timeout=30.0)
        try:
            snapshot = protobuf_fields(next(stream))
        finally:
            stream.cancel()
    info = protobuf_fields(snapshot[SNAPSHOT_SERVER_INFO])[1]
    return {
        "instance_id": snapshot[SNAPSHOT_INSTANCE_ID],
        "revision": snapshot.get(SNAPSHOT_REVISION, 0),
        "server_info": json.loads(info),
    }


def http_post(port: int, host: str, path: str) -> int:
    """The status of ``POST path`` with an empty JSON object."""
    request = urllib.request.Request(
        f"http://{host}:{port}{path}", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return reply.status


def completions(
    port: int, host: str, model: str, requests: list, concurrency: int, seconds: float = 600.0
) -> list[dict]:
    """Each ``[token ids, max tokens, nvext]`` of ``requests`` as an OpenAI ``POST
    /v1/completions`` (greedy, EOS ignored), up to ``concurrency`` at once; per request, in
    order, its ``usage`` and ``nvext``, or ``{"error": text}``."""
    from concurrent.futures import ThreadPoolExecutor

    def one(prompt: list[int], max_tokens: int, nvext: dict) -> dict:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "nvext": nvext}  # fmt: skip
        try:
            answer = post_json(f"http://{host}:{port}/v1/completions", body, seconds)
        except urllib.error.HTTPError as exc:
            return {"error": f"{exc.code} {exc.read()[:2000].decode(errors='replace')}"}
        except OSError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"usage": answer.get("usage"), "nvext": answer.get("nvext")}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda r: one(*r), requests))
