"""Child program: start one server under test, report its port, serve until stdin closes.

    python -m bench.serve KIND SIZE [EXTENSION]

Prints one JSON line, ``{"port": ..., "before": <its /proc status before the server module was
imported>}``; ``bench.servers.server_process`` starts it and reads that line.
"""

from __future__ import annotations

import argparse
import json
import sys

from bench.common import proc_status
from bench.servers import load_starter, snapshot


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("ours", "ours-generated", "upstream", "grpcio"))
    parser.add_argument("size", type=int, help="snapshot bytes")
    parser.add_argument("extension", nargs="?", default="", help="upstream's _grpc extension")
    args = parser.parse_args(argv)
    before = proc_status()
    port, stop = load_starter(args.kind, args.extension)(snapshot(args.size), 0)
    print(json.dumps({"port": port, "before": before}), flush=True)
    sys.stdin.read()
    stop()


if __name__ == "__main__":
    main()
