"""A leader node through SGLang's real ``http_server.launch_server``, FastAPI lifespan included.

Run as ``python -m overlay_harness.providers.http_node <sglang launch args…>``. Everything is
SGLang's own launch path (``Engine._launch_subprocesses``, ``_setup_and_run_http_server``,
uvicorn, the ``lifespan`` that starts the native gRPC server and then ``--sidecar``), with the
harness's stand-ins passed through ``launch_server``'s own parameters for the parts that need
a model: scheduler, tokenizer manager, detokenizer. Run it with ``--skip-server-warmup`` (no
model to warm up against).

Protocol on stdout as in ``overlay_harness.node``: ``{"event": "ready", ...}`` from SGLang's
``launch_callback`` once the lifespan is up, or ``{"event": "error", ...}``. Stop it with
SIGINT or SIGTERM: uvicorn shuts the lifespan down (sidecar first, then gRPC), as in
production.
"""

from __future__ import annotations

import sys
import types
from typing import Any
from unittest import mock

from overlay_harness import node


class _HttpTokenizerManager(types.SimpleNamespace):
    """The harness's stand-in tokenizer manager, widened for the HTTP frontend.

    The OpenAI-compatible handlers the lifespan builds, the signal and stop-hook wiring in
    ``_setup_and_run_http_server`` touch many more attributes than the gRPC path. None of them
    is used while the frontend only serves metadata, so any attribute the narrow stand-in
    lacks is a permissive mock.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = mock.MagicMock(name=f"tokenizer_manager.{name}")
        setattr(self, name, value)
        return value


def _http_tokenizer_manager(server_args: Any, port_args: Any) -> tuple[Any, Any]:
    narrow, template = node._standin_tokenizer_manager(server_args, port_args)
    manager = _HttpTokenizerManager(**vars(narrow))
    manager.set_startup_time = lambda startup_time: setattr(manager, "startup_time", startup_time)
    # The classification handler reads the model's label map at construction.
    manager.model_config.hf_config.id2label = {0: "LABEL_0"}
    return manager, template


def main(argv: list[str]) -> int:
    node._take_stdout()
    from sglang.srt.entrypoints import http_server
    from sglang.srt.server_args import prepare_server_args

    from overlay_harness.standin import run_standin_scheduler

    server_args = prepare_server_args(argv)

    def ready() -> None:
        node._emit({"event": "ready", "pids": [], "grpc_port": server_args.grpc_port})

    try:
        http_server.launch_server(
            server_args,
            init_tokenizer_manager_func=_http_tokenizer_manager,
            run_scheduler_process_func=run_standin_scheduler,
            run_detokenizer_process_func=node.run_standin_detokenizer,
            launch_callback=ready,
        )
    except BaseException as exc:
        node._emit({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        raise
    node._emit({"event": "exited"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
