"""A ``--sidecar`` provider that records what it was started with, then idles until SIGTERM.

``main(argv)`` writes ``{"pid", "ppid", "sys_argv", "argv", "environ"}`` as JSON to
``<--dump>.<pid>.json`` (written whole, then renamed, so a reader never sees half a file) and
waits for SIGTERM, as a long-running consumer would.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sidecar_dump")
    parser.add_argument("--dump", required=True)
    args, _unknown = parser.parse_known_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    record = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sys_argv": list(sys.argv),
        "argv": list(argv),
        "environ": dict(os.environ),
    }
    final = f"{args.dump}.{os.getpid()}.json"
    with open(f"{final}.tmp", "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.replace(f"{final}.tmp", final)
    stop.wait()
    return 0
