"""One node of an SGLang engine group, launched through SGLang's real launch code.

Run as ``python -m overlay_harness.node <sglang launch args…>`` (one process per node, as on a
real cluster, so each node has its own runtime context and plugin state). The node:

- parses the arguments with SGLang's ``prepare_server_args``;
- follower (``--node-rank >= 1``): ``Engine._launch_subprocesses`` with the stand-in scheduler,
  which runs the real follower branch (``SGLANG_BLOCK_NONZERO_RANK_CHILDREN=0``, the Engine API
  path, so it returns instead of blocking);
- leader: the same call, which also starts SGLang's real ``TokenizerManager`` (upstream's
  default ``init_tokenizer_manager``; ``--skip-tokenizer-init``, so the config-only model
  directory is enough) and real detokenizer process (``run_detokenizer_process``), then
  SGLang's own ``http_server._start_native_grpc_server_for_runtime``, i.e. the native gRPC
  server the HTTP lifespan starts, over SGLang's ``RuntimeHandle``. While it serves, the
  tokenizer manager's event loop runs, as under the HTTP server.

The scheduler (``overlay_harness.standin``) is the only stand-in.

Protocol on stdout: one JSON line ``{"event": "ready", "pids": [...], "grpc_port": P}`` or
``{"event": "error", "error": "..."}`` (then exit 1). The node keeps running until its stdin
closes, then stops as the Engine API does: SGLang's own ``Engine.shutdown`` on an ``Engine``
holding what ``Engine.__init__`` keeps after this launch (so the hooks on it run through
SGLang: the follower server's stop, then the node's process tree killed), and exits.
"""

from __future__ import annotations

import json
import os
import sys
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


def _serve_until_stdin_closes(tokenizer_manager: Any) -> None:
    """Block until the test closes our stdin.

    On the leader, the real ``TokenizerManager``'s event loop runs meanwhile (its
    ``handle_loop`` receiving from the real detokenizer), as it does under the HTTP server
    that normally hosts the native gRPC server; followers have no tokenizer manager.
    """
    if tokenizer_manager is None:
        sys.stdin.read()
        return
    loop = tokenizer_manager.event_loop
    loop.run_until_complete(loop.run_in_executor(None, sys.stdin.read))


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
        # Upstream's own tokenizer manager and detokenizer, as Engine() would pass them.
        result = Engine._launch_subprocesses(
            server_args,
            init_tokenizer_manager_func=Engine.init_tokenizer_manager_func,
            run_scheduler_process_func=run_standin_scheduler,
            run_detokenizer_process_func=Engine.run_detokenizer_process_func,
        )
        tokenizer_manager, template_manager, port_args, init_result = result[:4]
        # What Engine.__init__ keeps after this launch, for SGLang's own Engine.shutdown.
        engine = Engine.__new__(Engine)
        engine.server_args = server_args
        engine.port_args = port_args
        engine.tokenizer_manager = tokenizer_manager
        engine.template_manager = template_manager
        engine._scheduler_init_result = init_result
        engine.send_to_rpc = None
        if node_rank == 0:
            from sglang.srt.entrypoints import http_server
            from sglang.srt.runtime_context import get_serving

            grpc_handle = http_server._start_native_grpc_server_for_runtime(
                server_args=server_args,
                tokenizer_manager=tokenizer_manager,
                template_manager=template_manager,
                scheduler_info=init_result.scheduler_infos[0],
                grpc_port=get_serving().grpc_port,
            )
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
    _serve_until_stdin_closes(tokenizer_manager)
    try:
        if grpc_handle is not None:  # the HTTP lifespan's stop of the leader's server
            grpc_handle.shutdown()
    finally:
        # The follower server's stop (0.5.19-0.5.21: the overlay's BEFORE hook; 0.5.22+:
        # upstream's stop_grpc_server), then every child process of this node killed.
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
