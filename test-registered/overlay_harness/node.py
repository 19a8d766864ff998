"""One node of an SGLang engine group, launched through SGLang's real launch code.

Run as ``python -m overlay_harness.node <sglang launch args…>`` (one process per node, as on a
real cluster, so each node has its own runtime context and plugin state). The node:

- parses the arguments with SGLang's ``prepare_server_args``;
- follower (``--node-rank >= 1``): ``Engine._launch_subprocesses`` with the stand-in scheduler,
  which runs the real follower branch (``SGLANG_BLOCK_NONZERO_RANK_CHILDREN=0``, the Engine API
  path, so it returns instead of blocking);
- leader: the same call, with stand-ins for the tokenizer manager and detokenizer (they need
  a model to tokenize with), then SGLang's own
  ``http_server._start_native_grpc_server_for_runtime``, i.e. the native gRPC server the HTTP
  lifespan starts, over SGLang's ``RuntimeHandle``.

Protocol on stdout: one JSON line ``{"event": "ready", "pids": [...], "grpc_port": P}`` or
``{"event": "error", "error": "..."}`` (then exit 1). The node keeps running until its stdin
closes, then stops what it started (``Engine.shutdown``'s follower stop included) and exits.
"""

from __future__ import annotations

import json
import os
import sys
import types
from typing import Any

_protocol = None


def _take_stdout() -> None:
    """Keep fd 1 for events only; anything else printing to stdout goes to stderr."""
    global _protocol
    _protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)


def _emit(event: dict) -> None:
    _protocol.write(json.dumps(event) + "\n")
    _protocol.flush()


def run_standin_detokenizer(server_args: Any, port_args: Any) -> None:
    """Idle like a detokenizer with nothing to detokenize, until the parent goes away."""
    import multiprocessing
    import multiprocessing.connection

    parent = multiprocessing.parent_process()
    if parent is not None:
        multiprocessing.connection.wait([parent.sentinel])


def _standin_tokenizer_manager(server_args: Any, port_args: Any) -> tuple[Any, None]:
    import asyncio

    manager = types.SimpleNamespace(
        server_args=server_args,
        event_loop=asyncio.new_event_loop(),
        startup_time=None,
        max_req_input_len=None,
    )
    manager.set_startup_time = lambda startup_time: setattr(manager, "startup_time", startup_time)
    # What RuntimeHandle and the native server touch while serving metadata only.
    manager.auto_create_handle_loop = lambda: None
    manager.set_engine_state_changed_callback = lambda callback: None
    manager.is_pause = False
    manager.gracefully_exit = False
    manager.is_healthy = lambda: True
    manager.tokenizer = None
    manager.model_path = server_args.model_path
    manager.served_model_name = server_args.model_path
    manager.is_generation = True
    manager.mm_processor = None
    manager.lora_registry = None
    manager.config_value = lambda name: getattr(server_args, name, None)
    hf_config = types.SimpleNamespace(model_type="llama", architectures=["LlamaForCausalLM"])
    manager.model_config = types.SimpleNamespace(
        hf_config=hf_config, context_len=2048, embedding_model_spec=None
    )
    from sglang.srt.managers.tokenizer_manager import ServerStatus

    manager.server_status = ServerStatus.Up
    return manager, None


def main(argv: list[str]) -> int:
    _take_stdout()
    os.environ["SGLANG_BLOCK_NONZERO_RANK_CHILDREN"] = "0"
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.server_args import prepare_server_args

    from overlay_harness.standin import run_standin_scheduler

    server_args = prepare_server_args(argv)
    node_rank = server_args.node_rank or 0
    grpc_handle = None
    engine = None
    try:
        result = Engine._launch_subprocesses(
            server_args,
            init_tokenizer_manager_func=_standin_tokenizer_manager,
            run_scheduler_process_func=run_standin_scheduler,
            run_detokenizer_process_func=run_standin_detokenizer,
        )
        tokenizer_manager, _template, _ports, init_result = result[:4]
        if node_rank == 0:
            from sglang.srt.entrypoints import http_server
            from sglang.srt.runtime_context import get_serving

            grpc_handle = http_server._start_native_grpc_server_for_runtime(
                server_args=server_args,
                tokenizer_manager=tokenizer_manager,
                template_manager=None,
                scheduler_info=init_result.scheduler_infos[0],
                grpc_port=get_serving().grpc_port,
            )
        # An Engine object as the Engine API holds it after launch, for shutdown().
        engine = Engine.__new__(Engine)
        engine._scheduler_init_result = init_result
    except BaseException as exc:  # report, then fail the node as the launcher would
        _emit({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    _emit(
        {
            "event": "ready",
            "pids": list(init_result.all_child_pids),
            "grpc_port": server_args.grpc_port,
        }
    )
    sys.stdin.read()  # until the test closes our stdin
    try:
        _stop_follower(engine)
    finally:
        if grpc_handle is not None:
            grpc_handle.shutdown()
    return 0


def _stop_follower(engine: Any) -> None:
    """What ``Engine.shutdown`` does for the follower server, through the hooked method."""
    from sglang.srt.entrypoints.engine import Engine

    init_result = engine._scheduler_init_result
    stop = getattr(init_result, "stop_grpc_server", None)
    if callable(stop):  # 0.5.22+: upstream's own stop, which calls our handle's shutdown()
        stop()
        return
    # 0.5.19-0.5.21: the overlay's BEFORE hook on Engine.shutdown stops the server; the
    # rest of shutdown needs a full Engine and is not part of this node.
    hooked = Engine.shutdown
    before = getattr(hooked, "__wrapped__", None)
    if before is None:
        return
    from sglang_sidecar_overlay.adapters import v0_5_19

    v0_5_19.before_engine_shutdown(engine)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
