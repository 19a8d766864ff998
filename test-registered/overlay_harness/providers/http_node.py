"""A leader node through SGLang's real ``http_server.launch_server``, FastAPI lifespan included.

Run as ``python -m overlay_harness.providers.http_node <sglang launch args…>``. Everything is
SGLang's own launch path: plugins loaded first, as ``sglang.launch_server``'s main and ``sglang
serve`` do (so hooks on ``launch_server`` itself run), then ``Engine._launch_subprocesses``, the
real ``TokenizerManager`` and detokenizer process, ``_setup_and_run_http_server``, uvicorn, the
``lifespan`` that starts the native gRPC server and then ``--sidecar``. Only the scheduler is
the harness's stand-in (``overlay_harness.standin``), passed through ``launch_server``'s own
``run_scheduler_process_func`` parameter; the tokenizer manager and detokenizer are upstream's
defaults. Run it with ``--skip-tokenizer-init`` (the model directory holds a config only) and
``--skip-server-warmup`` (the stand-in runs no model to warm up against).

Protocol on stdout as in ``overlay_harness.node``: ``{"event": "ready", ...}`` from SGLang's
``launch_callback`` once the lifespan is up, or ``{"event": "error", ...}``. Stopping it works
as in production. SIGINT reaches uvicorn, which shuts the lifespan down (sidecar first, then
gRPC). SIGTERM reaches the handler the real tokenizer manager installs on its event loop:
the overlay's hook on it stops the ``--sidecar`` at once; SGLang then drains requests, sends
``ShutdownReq``, kills the node's child processes and only then stops uvicorn (0.5.20+; 0.5.19
calls ``sys.exit`` instead).
"""

from __future__ import annotations

import sys

from overlay_harness import node


def main(argv: list[str]) -> int:
    node._take_stdout()
    from sglang.srt.entrypoints import http_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    from overlay_harness.standin import run_standin_scheduler

    # As ``python -m sglang.launch_server`` and ``sglang serve`` do: plugins first, so hooks on
    # ``launch_server`` itself run (``_launch_subprocesses`` loading them again is a no-op).
    load_plugins()
    server_args = prepare_server_args(argv)

    def ready() -> None:
        node._emit({"event": "ready", "pids": [], "grpc_port": server_args.grpc_port})

    try:
        # Tokenizer manager, detokenizer and warmup stay launch_server's defaults.
        http_server.launch_server(
            server_args,
            run_scheduler_process_func=run_standin_scheduler,
            launch_callback=ready,
        )
    except BaseException as exc:
        node._emit({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        raise
    node._emit({"event": "exited"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
