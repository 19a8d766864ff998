"""One node of an SGLang engine group, launched through SGLang's own launch code with its real
schedulers (on the CPU test platform; ``overlay_harness.group`` builds the arguments).

Run as ``python -m overlay_harness.node_process ROLE <sglang launch args...>``, one process per
node, as on a real cluster, ROLE being one of:

- ``leader`` (``--node-rank 0``): what ``python -m sglang.launch_server`` does, plugins loaded
  first, then ``http_server.launch_server``: real schedulers (through the DP controller where
  SGLang uses one), tokenizer manager and detokenizer, uvicorn and the FastAPI lifespan (native
  gRPC server, ``--sidecar``), SGLang's warm-up request. Ready once SGLang reports the server
  ready (its ``launch_callback``, after the warm-up).
- ``follower``: ``Engine._launch_subprocesses`` with ``SGLANG_BLOCK_NONZERO_RANK_CHILDREN=0``
  (SGLang's Engine-API path for a non-zero node rank, which returns once its schedulers are
  ready instead of blocking in them): ready then; stopped with SGLang's own
  ``Engine.shutdown`` on an ``Engine`` holding what ``Engine.__init__`` keeps.
- ``blocking-follower``: ``launch_server`` itself, i.e. SGLang's blocking follower
  branch, which returns only when its schedulers have exited. No ready event.

A leader's DP controller polls its socket without blocking from the moment its schedulers are
ready, a whole core while the node is idle (a GPU host has cores to spare; this 2-core machine
has not). :func:`yield_busy_pollers` lowers it to ``nice 19`` as soon as it exists and keeps the
processes it spawns (the schedulers, which would inherit its niceness) at the node's own: it
still forwards every request, and spins only on otherwise idle CPU. That lasts until the leader
serves; the controller spawns nothing after its schedulers are ready. A follower's DP controller
does not poll. The schedulers themselves sleep when idle (``--sleep-on-idle``,
``overlay_harness.group``).

Protocol on stdout (fd 1 carries only this; anything else printed goes to stderr): one JSON
line ``{"event": "ready", "pids": [...]}`` (a follower's scheduler processes), or
``{"event": "error", "error": "..."}`` and exit 1, or ``{"event": "exited"}`` when a blocking
launch returns. Closing stdin stops the node the way it is stopped in production: SIGTERM to
the leader (SGLang's own handler drains and shuts down), ``Engine.shutdown`` on a follower.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any

from sglang_sidecar_overlay.sidecar import proctree

from overlay_harness import scheduler_faults

_protocol = None


def _take_stdout() -> None:
    global _protocol
    _protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)


def _emit(event: dict) -> None:
    _protocol.write(json.dumps(event) + "\n")
    _protocol.flush()


def _sigterm_when_stdin_closes() -> None:
    def wait() -> None:
        sys.stdin.read()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="stop-on-stdin-eof", daemon=True).start()


# Process titles (/proc comm, 15 bytes) of SGLang processes that poll without blocking.
BUSY_POLLERS = (b"sglang::data_pa",)
BUSY_POLLER_NICE = 19
# How often a launching leader looks for a new DP controller and the processes it spawned.
BUSY_POLLER_CHECK_SECONDS = 0.5


def yield_busy_pollers(lowered: set[int]) -> None:
    """Renice this node's busy-polling SGLang processes to the lowest priority (their pids go to
    ``lowered``), and their children back to this node's priority."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    table = proctree.process_table()
    for pid, _start in proctree.descendants(os.getpid(), table):
        stat = table.get(pid)
        try:
            if pid not in lowered and _comm(pid) in BUSY_POLLERS:
                os.setpriority(os.PRIO_PROCESS, pid, BUSY_POLLER_NICE)
                lowered.add(pid)
            elif stat is not None and stat.ppid in lowered:
                if os.getpriority(os.PRIO_PROCESS, pid) != own:
                    os.setpriority(os.PRIO_PROCESS, pid, own)
        except OSError:
            continue  # gone meanwhile


def _comm(pid: int) -> bytes:
    with open(f"/proc/{pid}/comm", "rb") as f:
        return f.read().strip()


_serving_event = threading.Event()


def _yield_busy_pollers_until_serving() -> None:
    def watch() -> None:
        lowered: set[int] = set()
        while not _serving_event.wait(BUSY_POLLER_CHECK_SECONDS):
            yield_busy_pollers(lowered)
        yield_busy_pollers(lowered)

    threading.Thread(target=watch, name="yield-busy-pollers", daemon=True).start()


def _serving() -> None:
    _serving_event.set()
    _emit({"event": "ready", "pids": []})


def _scheduler_kwargs() -> dict[str, Any]:
    """``launch_server``'s scheduler function: its default unless a fault is injected."""
    function = scheduler_faults.scheduler_function()
    return {} if function is None else {"run_scheduler_process_func": function}


def serve_with_launch_server(argv: list[str]) -> int:
    """Leader, or a blocking follower: SGLang's ``launch_server`` path."""
    from sglang.srt.entrypoints import http_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    # As ``python -m sglang.launch_server`` does: plugins first, so hooks on ``launch_server``
    # itself run (``_launch_subprocesses`` loading them again is a no-op).
    load_plugins()
    server_args = prepare_server_args(argv)
    _sigterm_when_stdin_closes()
    try:
        http_server.launch_server(
            server_args,
            launch_callback=_serving,
            **_scheduler_kwargs(),
        )
    except BaseException as exc:
        _emit({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        raise
    _emit({"event": "exited"})
    return 0


def serve_leader(argv: list[str]) -> int:
    """The leader: ``launch_server``, its DP controller lowered until it serves."""
    _yield_busy_pollers_until_serving()
    return serve_with_launch_server(argv)


def serve_follower_engine(argv: list[str]) -> int:
    """A follower through SGLang's Engine-API path (returns once its schedulers are ready)."""
    os.environ["SGLANG_BLOCK_NONZERO_RANK_CHILDREN"] = "0"
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(argv)
    try:
        # What Engine() passes: its own tokenizer manager, scheduler and detokenizer functions.
        result = Engine._launch_subprocesses(
            server_args,
            init_tokenizer_manager_func=Engine.init_tokenizer_manager_func,
            run_scheduler_process_func=scheduler_faults.scheduler_function()
            or Engine.run_scheduler_process_func,
            run_detokenizer_process_func=Engine.run_detokenizer_process_func,
        )
    except BaseException as exc:  # report, then fail the node as the launcher would
        _emit({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    tokenizer_manager, template_manager, port_args, init_result = result[:4]
    # What Engine.__init__ keeps after this launch, for SGLang's own Engine.shutdown.
    engine = Engine.__new__(Engine)
    engine.server_args = server_args
    engine.port_args = port_args
    engine.tokenizer_manager = tokenizer_manager
    engine.template_manager = template_manager
    engine._scheduler_init_result = init_result
    engine.send_to_rpc = None
    _emit({"event": "ready", "pids": list(init_result.all_child_pids)})
    sys.stdin.read()
    # The follower server's stop (0.5.19-0.5.21: the overlay's BEFORE hook; 0.5.22+:
    # upstream's stop_grpc_server), then every child process of this node killed.
    engine.shutdown()
    return 0


ROLES = {
    "leader": serve_leader,
    "blocking-follower": serve_with_launch_server,
    "follower": serve_follower_engine,
}


def main(argv: list[str]) -> int:
    _take_stdout()
    role, *args = argv
    return ROLES[role](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
