"""Report helper shared by the provider fixtures."""

from __future__ import annotations

import json
import os
import resource
import sys
import time


def report_path(argv: list[str]) -> str:
    return argv[argv.index("--report") + 1]


def write_report(argv: list[str], suffix: str = "", **extra: object) -> None:
    path = report_path(argv) + suffix
    data = {
        "argv": list(argv),
        "endpoint_env": os.environ.get("SGLANG_GRPC_ENDPOINT"),
        "dynamo_endpoint_env": os.environ.get("DYN_SIDECAR_GRPC_ENDPOINT"),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "time": time.monotonic(),
        "modules": sorted(
            m
            for m in sys.modules
            if m.split(".")[0] in ("sglang", "sglang_sidecar_overlay", "torch")
        ),
        **extra,
    }
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)
    # One line per start, so restart tests can see every run.
    with open(path + ".log", "a") as f:
        f.write(json.dumps(data) + "\n")


def no_core_dumps() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def sleep_forever() -> None:
    while True:
        time.sleep(3600)
