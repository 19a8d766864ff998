"""Program run in an SGLang 0.5.22+ environment: the leader's GetServerInfo reply per call,
built by the overlay's hook on every call vs the overlay's cached text.

    python -m bench.leader_reply [--calls 200]

run by ``bench.leader_info`` with the package copy, ``scripts/`` and ``test-registered/``
importable (``dev_paths.child_environ``).

Prints one JSON line: ``rebuilt`` and ``cached`` (s per call, five alternating rounds) and
``bytes``, or ``error``. SGLang's real ``RuntimeHandle.get_server_info`` runs on a leader's
launch-time state (server args of the config-only tiny model of ``test-registered``'s
harness, two KV sources), on the handle the harness builds for its in-process tests
(``overlay_harness.in_process.leader_runtime_handle``).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

ROUNDS = 5


def leader_handle() -> Any:
    """A ``RuntimeHandle`` on a leader's launch-time state."""
    from overlay_harness.group import TINY_MODEL
    from overlay_harness.in_process import leader_runtime_handle
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang_sidecar_overlay.adapters import _launch

    kv = json.dumps({"publisher": "zmq", "endpoint": "tcp://*:45557", "topic": ""})
    server_args = prepare_server_args(
        ["--model-path", str(TINY_MODEL), "--skip-tokenizer-init", "--device", "cpu", "--tp", "2",
         "--dp", "2", "--enable-dp-attention", "--grpc-port", "45999", "--kv-events-config", kv]
    )  # fmt: skip
    server_args.resolve_once()
    load_plugins()
    _launch.begin_node_launch()
    sources = [
        {"dp_rank": r, "endpoint": f"tcp://127.0.0.1:{45557 + r}", "topic": "", "block_size": 1}
        for r in range(2)
    ]
    return leader_runtime_handle(server_args, sources, media_tokens=False)


def measure(calls: int) -> dict[str, Any]:
    handle = leader_handle()
    from overlay_harness.in_process import install_launch_hooks
    from sglang.srt.entrypoints.grpc_bridge import RuntimeHandle
    from sglang_sidecar_overlay.adapters._launch import LEADER_JSON_ATTR

    install_launch_hooks(["leader_grpc"])
    cached = RuntimeHandle.get_server_info

    def rebuilt(handle: Any) -> str:
        # As if each call were a new launch's first: the hook finds no cached text.
        vars(handle).pop(LEADER_JSON_ATTR, None)
        return cached(handle)

    paths = {"rebuilt": rebuilt, "cached": cached}
    if paths["cached"](handle) != paths["rebuilt"](handle):
        return {"error": "the cached reply differs from a rebuilt one"}
    out: dict[str, Any] = {"rebuilt": [], "cached": [], "bytes": len(paths["cached"](handle))}
    for _ in range(ROUNDS):
        for name, method in paths.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                method(handle)
            out[name].append((time.perf_counter() - t0) / calls)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per round and path")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.calls)))


if __name__ == "__main__":
    main()
