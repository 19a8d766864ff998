"""A follower node's own metadata server, in its engine process, and the crash watch on its
schedulers.

:func:`start_node_follower` runs once the node's schedulers are ready, with the node's launch:
the node's server info from the builder, served by ``server.follower`` on
``--host``/``--grpc-port``, and the opt-in follower sidecar when one is configured (started
here once the server is SERVING, and put first on the server's stop path).
:func:`failing_on_scheduler_crash` replaces the follower branch's wait on its schedulers, so a
crashed scheduler fails the node instead of letting it exit 0; :func:`stop_server_before_signals`
puts the server's stop ahead of SGLang's SIGQUIT crash path and of an orchestrator's SIGTERM,
and the wait puts it back in front of a handler SGLang installed after it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sglang_sidecar_overlay.adapters import _sglang
from sglang_sidecar_overlay.adapters._node_launch import NodeLaunch
from sglang_sidecar_overlay.adapters._server_info import node_server_info
from sglang_sidecar_overlay.contract.server_info import render_server_info
from sglang_sidecar_overlay.sidecar import proctree

if TYPE_CHECKING:
    from sglang_sidecar_overlay.server.follower import FollowerMetadataServer

logger = logging.getLogger(__name__)


def start_node_follower(
    launch: NodeLaunch, server_args: Any, scheduler_info: Mapping[str, Any]
) -> FollowerMetadataServer:
    """Start this follower node's metadata server on ``--host``/``--grpc-port``, watching the
    ``launch``'s scheduler processes (with the launch's opt-in sidecar, if any)."""
    # Imported here: only a follower's engine process serves its own metadata.
    from sglang_sidecar_overlay.server.follower import start_follower_server

    cfg = _sglang.serving()
    info = node_server_info(launch, server_args, scheduler_info)
    server = start_follower_server(
        str(cfg.host), int(cfg.grpc_port), render_server_info(info), launch.scheduler_pids()
    )
    if launch.sidecar is not None:
        _with_follower_sidecar(server, launch, info.get("kv_event_sources") or [])
    stop_server_before_signals(server)
    launch.follower_server = server
    return server


def _with_follower_sidecar(
    server: FollowerMetadataServer, launch: NodeLaunch, sources: list[dict[str, Any]]
) -> None:
    """Start the launch's follower sidecar against ``server``, first on the server's stop path.

    If the sidecar cannot start, the server is stopped and the error raised (the caller reaps
    the node's schedulers, as for a bind failure).
    """
    # Imported only where a sidecar is configured: the supervisor is most of the code.
    from sglang_sidecar_overlay.adapters import _sidecar

    try:
        sidecar = _sidecar.start_follower_sidecar(launch, server.host, server.port, sources)
    except BaseException:
        server.stop()
        raise
    if sidecar is not None:
        # The sidecar first on every stop path (upstream's shutdown(), the overlay's stop(),
        # the scheduler watcher): it must not watch its metadata server disappear.
        server.add_before_stop(sidecar.stop)


def stop_server_before_signals(server: FollowerMetadataServer) -> None:
    """Chain the follower's SIGQUIT and SIGTERM handlers so ``server`` (its sidecar first)
    stops before either signal takes the node down.

    SIGQUIT is SGLang's crash path: a failing scheduler (or sidecar) sends it to the engine
    process, and SGLang's handler SIGKILLs the node's whole process tree at once. SIGTERM is an
    orchestrator's stop (Slurm's ``scancel``, Kubernetes deleting the pod); a follower has no
    handler for it, so the process ends on the spot. Either way health would never turn
    NOT_SERVING and the sidecar would outlive its server or get no SIGTERM, so a consumer such
    as Dynamo's stays registered for ranks that are gone. Chained once the server is SERVING:
    NOT_SERVING and the sidecar's bounded stop (``server.stop()``), then the handler it
    replaced. Idempotent: a handler installed since (0.5.23's follower installs a SIGTERM
    handler that waits for the leader's shutdown broadcast after the server started) is
    chained behind the server's stop again. Signal handlers can only be set from the main
    thread; elsewhere SGLang's are left as they are.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if getattr(signal.getsignal(signum), "stops_first", None) is not server:
            _stop_server_before(server, signum)


STOP_SIGNALS = (signal.SIGQUIT, signal.SIGTERM)


def _stop_server_before(server: FollowerMetadataServer, signum: signal.Signals) -> None:
    previous = signal.getsignal(signum)
    # SIGQUIT means something crashed; SIGTERM is an orderly stop.
    level = logging.ERROR if signum == signal.SIGQUIT else logging.INFO

    def stop_then_forward(received: int, frame: Any) -> None:
        # No SGLang call here: a signal handler only stops and forwards.
        logger.log(
            level,
            "%s on this follower node: stopping its metadata server at %s (its sidecar "
            "first) before SGLang's handler",
            signum.name,
            server.address,
        )
        server.stop()
        signal.signal(signum, previous)
        if callable(previous):
            previous(received, frame)
        else:  # the default action (or ignore), as if this handler had never been there
            os.kill(os.getpid(), signum)

    stop_then_forward.stops_first = server  # type: ignore[attr-defined]
    signal.signal(signum, stop_then_forward)


def exit_description(exitcode: int) -> str:
    """``exit code 3`` or ``signal SIGKILL``, from a ``multiprocessing`` exit code."""
    if exitcode >= 0:
        return f"exit code {exitcode}"
    return f"signal {proctree.signal_name(-exitcode) or -exitcode}"


def failing_on_scheduler_crash(block: Callable[[], None], launch: NodeLaunch) -> Callable[[], None]:
    """``block_until_scheduler_exits`` of a follower node that fails when a scheduler crashed,
    with the node's metadata server stopped first on SIGQUIT and SIGTERM while it waits.

    SGLang's follower branch joins its scheduler processes in order, logs each exit and
    returns, so ``launch_server`` returns and the node exits 0 even when a scheduler was
    killed, and it keeps waiting on the first one while a later one is already dead. This
    waits on all of them at once instead: the first non-zero exit (or signal) reaps the
    node's other schedulers and raises, naming the process and how it ended, so the node
    exits non-zero with the cause. When every one ends with exit code 0, upstream's join
    runs as before.
    """

    procs = launch.procs

    def block_then_check() -> None:
        if launch.follower_server is not None:
            # SGLang may have replaced the handlers since the server started (0.5.23 does).
            stop_server_before_signals(launch.follower_server)
        crashed = _first_crash(list(procs or []))
        if crashed is None:
            block()
            crashed = next((p for p in procs or [] if p.exitcode not in (None, 0)), None)
        if crashed is None:
            return
        wait_for_own_stop_signal(crashed.exitcode)
        _sglang.reap(p for p in procs or [] if p.exitcode is None)
        message = (
            f"follower node {_sglang.node_rank()}: scheduler process {crashed.pid} "
            f"({exit_description(crashed.exitcode)}) ended while the node served; the node stops"
        )
        logger.error("%s", message)
        raise RuntimeError(message)

    return block_then_check


# How long a scheduler's SIGTERM waits for the node's own before it counts as a crash.
STOP_SIGNAL_GRACE = 2.0


def wait_for_own_stop_signal(exitcode: int, grace: float = STOP_SIGNAL_GRACE) -> None:
    """A scheduler ended by SIGTERM: wait up to ``grace`` seconds for the node's own stop.

    An orchestrator may signal every process of the node at once (Slurm's ``scancel`` signals
    each process of the job step): the scheduler can end before this process's own signal
    handler, or the sidecar's exit and SIGQUIT, ends the node as a stop rather than a crash.
    A scheduler SIGTERMed alone is still a crash once ``grace`` has passed.
    """
    if exitcode == -signal.SIGTERM:
        threading.Event().wait(grace)


def _first_crash(procs: list[Any]) -> Any | None:
    """Wait until every process has ended or one has ended badly; that one, or None.

    Processes without a ``sentinel`` (not ``multiprocessing`` ones) are left to upstream.
    """
    from multiprocessing.connection import wait

    pending = [p for p in procs if getattr(p, "sentinel", None) is not None]
    while pending:
        wait([p.sentinel for p in pending])
        for proc in [p for p in pending if p.exitcode is not None]:
            pending.remove(proc)
            if proc.exitcode != 0:
                return proc
    return None
