"""Child program: seconds from a server's start call to the first GetServerInfo it answers.

    python -m bench.first_call KIND EXTENSION

Prints one JSON line, ``{"first": s, "client_floor": s}``: the client floor is the same
client's first call on a fresh channel to the already running server, the part of the figure
that is not the server's.
"""

from __future__ import annotations

import argparse
import json
import time

from bench.servers import free_port, load_starter, snapshot

SNAPSHOT_BYTES = 20 * 1024


def main(argv: list[str] | None = None) -> None:
    import grpc
    from sglang_sidecar_overlay.tools.probe import wire

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("ours", "upstream", "grpcio"))
    parser.add_argument("extension", help="upstream's _grpc extension")
    args = parser.parse_args(argv)
    json_info = snapshot(SNAPSHOT_BYTES)
    start = load_starter(args.kind, args.extension)
    port = free_port()
    # The client is imported and its channel created before the clock starts; channels
    # connect lazily, so nothing reaches the port before the server exists.
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(wire.GET_SERVER_INFO_PATH)
    t0 = time.monotonic()
    _, stop = start(json_info, port)
    call(b"", wait_for_ready=True, timeout=10)
    first = time.monotonic() - t0
    with grpc.insecure_channel(f"127.0.0.1:{port}") as fresh:
        t1 = time.monotonic()
        fresh.unary_unary(wire.GET_SERVER_INFO_PATH)(b"", wait_for_ready=True, timeout=10)
        floor = time.monotonic() - t1
    channel.close()
    stop()
    print(json.dumps({"first": first, "client_floor": floor}))


if __name__ == "__main__":
    main()
