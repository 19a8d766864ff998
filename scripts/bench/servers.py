"""The GetServerInfo servers under test, each in a process of its own, and the load client.

Shared by the benchmark rows and the hostile-input runs (``tests/hostile_patterns.py``):

- ``ours`` / ``ours-generated``: ``_native.start_metadata_server`` (hand-framed reply, or
  tonic's generated server);
- ``upstream``: ``start_metadata_server`` of the ``_grpc`` extension of the newest release's
  sglang wheel, loaded on its own (no SGLang import);
- ``grpcio``: a Python ``grpc.server`` returning the same pre-encoded response.

:func:`server_process` runs one of them in a child (``python -m bench.serve``) so its memory
and CPU can be read from ``/proc`` while the load runs in another process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import resource
import socket
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from envs import RELEASES
from testkit.wire_server import encode_get_server_info_response

from bench.common import ROOT, SCRIPTS, bench_cache, package_environ, proc_status

UPSTREAM_RELEASE = RELEASES.NEWEST_RELEASE
GRPCIO_WORKERS = 64

Starter = Callable[[str, int], tuple[int, Callable[[], None]]]


def snapshot(size: int) -> str:
    """A JSON object of exactly ``size`` bytes."""
    head, tail = '{"pad":"', '"}'
    return head + "x" * (size - len(head) - len(tail)) + tail


def encoded_response(json_info: str) -> bytes:
    """``GetServerInfoResponse{json_info}`` as every server sends it."""
    return encode_get_server_info_response(json_info)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def upstream_grpc_extension() -> Path:
    """The ``_grpc`` extension out of the sglang wheel, downloaded once into the cache."""
    target = bench_cache() / f"sglang-{UPSTREAM_RELEASE}"
    found = sorted(target.glob("_grpc*.so"))
    if found:
        return found[0]
    from sglang_wheel import sglang_wheel

    with zipfile.ZipFile(sglang_wheel(UPSTREAM_RELEASE)) as wheel:
        member = next(
            n for n in wheel.namelist() if n.startswith("sglang/srt/rust_extensions/_grpc")
        )
        target.mkdir(exist_ok=True)
        out = target / Path(member).name
        out.write_bytes(wheel.read(member))
    return out


def build_client() -> Path:
    """The Rust HTTP/2 load client ``rust/bench-client``, built with cargo."""
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "-p", "sglang-sidecar-overlay-bench-client"],
        cwd=ROOT,
        check=True,
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "release" / "bench-client"


# --- starting one server (in the child) --------------------------------------------------------


def load_starter(kind: str, extension: str) -> Starter:
    """Imports one server kind; returns ``start(json_info, port) -> (bound port, stop)``.

    Importing is kept apart from starting so the start-up figure times the start call alone.
    """
    if kind in ("ours", "ours-generated"):
        return _ours_starter("generated" if kind == "ours-generated" else "framed")
    if kind == "upstream":
        return _upstream_starter(extension)
    if kind == "grpcio":
        return _grpcio_starter()
    raise ValueError(f"unknown server {kind!r}")


def _ours_starter(implementation: str) -> Starter:
    from sglang_sidecar_overlay._native import start_metadata_server

    def start_ours(json_info: str, port: int) -> tuple[int, Callable[[], None]]:
        server = start_metadata_server("127.0.0.1", port, json_info, implementation=implementation)
        return server.port, server.shutdown

    return start_ours


def _upstream_starter(extension: str) -> Starter:
    spec = importlib.util.spec_from_file_location("_grpc", extension)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def start_upstream(json_info: str, port: int) -> tuple[int, Callable[[], None]]:
        # Upstream's handle does not report the bound port, so port 0 is not an option.
        port = port or free_port()
        return port, module.start_metadata_server("127.0.0.1", port, json_info).shutdown

    return start_upstream


def _grpcio_starter() -> Starter:
    from concurrent import futures

    import grpc
    from sglang_sidecar_overlay.tools.probe import wire

    def start_grpcio(json_info: str, port: int) -> tuple[int, Callable[[], None]]:
        payload = encoded_response(json_info)
        handler = grpc.method_handlers_generic_handler(
            wire.SGLANG_SERVICE,
            {"GetServerInfo": grpc.unary_unary_rpc_method_handler(lambda req, ctx: payload)},
        )
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=GRPCIO_WORKERS),
            handlers=[handler],
            options=[("grpc.max_send_message_length", -1)],
        )
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        return bound, lambda: server.stop(None)

    return start_grpcio


# --- the server's process (in the parent) ------------------------------------------------------


@dataclasses.dataclass
class ServerProcess:
    """A server child process; its memory is read from ``/proc``."""

    proc: subprocess.Popen[str]
    port: int
    kind: str
    # The child's /proc status before it imported its server module.
    before: dict[str, int]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kib(self) -> int:
        return proc_status(self.pid)["VmRSS"]

    def reset_peak(self) -> None:
        """Resets VmHWM to the current RSS, so the next reading is this phase's peak."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def peak_kib(self) -> int:
        return proc_status(self.pid)["VmHWM"]


@contextlib.contextmanager
def server_process(
    kind: str = "ours", size: int = 4096, extension: str | None = None
) -> Iterator[ServerProcess]:
    """Starts a server child and stops it (stdin closed, then killed) however the block ends."""
    argv = [sys.executable, "-m", "bench.serve", kind, str(size)]
    if extension:
        argv.append(extension)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=package_environ(SCRIPTS),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{kind} server exited before reporting its port")
        reported = json.loads(line)
        yield ServerProcess(proc, reported["port"], kind, reported["before"])
    finally:
        if proc.stdin:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def check_bytes(port: int, json_info: str) -> None:
    """Every server must answer with exactly the snapshot, or the comparison means nothing."""
    import grpc
    from sglang_sidecar_overlay.tools.probe import wire

    with grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", -1)]
    ) as channel:
        raw = channel.unary_unary(wire.GET_SERVER_INFO_PATH)(b"", timeout=10)
    if wire.decode_get_server_info_response(raw) != json_info:
        raise RuntimeError(f"server on port {port} did not return the snapshot")


def children_cpu_seconds() -> float:
    """CPU time (user + system) of this process's reaped children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_load(client: Path, server: ServerProcess, concurrency: int, args: Any, expect: int) -> dict:
    """One timed load run of ``rust/bench-client`` against ``server``, with the server's and
    the client's CPU per call."""
    from bench.common import cpu_seconds

    cpu_before = cpu_seconds(server.pid)
    client_before = children_cpu_seconds()
    out = subprocess.run(
        [
            str(client),
            "--target",
            server.address,
            "--concurrency",
            str(concurrency),
            "--duration",
            str(args.duration),
            "--warmup",
            str(args.warmup),
            "--threads",
            str(args.client_threads),
            "--client",
            args.load_client,
            "--expect-bytes",
            str(expect),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout)
    # The server also worked through the warm-up; assume it ran at the measured rate.
    served = result["rps"] * (args.duration + args.warmup)
    result["cpu_us"] = (cpu_seconds(server.pid) - cpu_before) * 1e6 / max(served, 1)
    # The client is the only child reaped meanwhile (the servers outlive the run).
    result["client_cpu_us"] = (children_cpu_seconds() - client_before) * 1e6 / max(served, 1)
    if result["errors"] or result["wrong_size"] or not result["requests"]:
        raise RuntimeError(f"bad load run against port {server.port}: {out.stdout}")
    return result
