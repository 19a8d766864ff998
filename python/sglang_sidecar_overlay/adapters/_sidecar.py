"""``--sidecar`` in SGLang: the core supervisor in upstream's place, on leader and followers.

Shared by both adapter generations (SGLang 0.5.19–0.5.23 start and stop the sidecar the
same way). What runs where:

- Leader (engine process, Python HTTP mode): upstream's FastAPI ``lifespan`` calls
  ``sglang.srt.entrypoints.sidecar.start_sidecar()`` right after the native gRPC server has
  bound its listener, and on the way out calls ``sidecar.stop()`` *before* shutting gRPC down.
  ``start_sidecar`` is wrapped (AROUND) to return a :class:`NodeSidecar` over the core
  ``SidecarSupervisor``, so upstream's start point and stop order are kept as they are.
- Follower (engine process, ``node_rank >= 1``), opt-in with ``--sidecar-on-followers`` in
  ``sidecar_args``: :func:`start_follower_sidecar` starts the sidecar once the follower
  metadata server is SERVING, pointed at it, and only when the node owns at least one KV
  publisher. The follower start (``_follower``) stops it *before* that server stops (a
  consumer that loses its metadata server errors out a few seconds later, which is noise
  during an orderly shutdown).
- ``SGLANG_RUST_SERVER`` mode is left to upstream: there 0.5.23's ``rust_server_sidecar``
  owns the sidecar (and ``start_sidecar`` is called through to the original).

An unexpected sidecar exit (with the default ``never`` restart policy, or once the restart
budget is spent) brings the node down the way upstream's watchdog does: SIGQUIT to the
engine process, whose SGLang handler kills the whole process tree.

SIGTERM: SGLang's tokenizer manager handles it on its event loop (``SignalHandler``), drains,
then SIGKILLs the node's whole process tree before uvicorn runs the lifespan's ``stop()``. An
AFTER hook on that handler starts stopping the node's sidecars at once, so the provider gets
its SIGTERM and grace period first and its death is never mistaken for a crash.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sglang_sidecar_overlay.adapters import _sglang
from sglang_sidecar_overlay.adapters._hooks import Hook
from sglang_sidecar_overlay.adapters._node_launch import (
    NodeLaunch,
    RunningSidecars,
    current_launch,
)
from sglang_sidecar_overlay.sidecar.grandchild_watchdog import fail_stop_node
from sglang_sidecar_overlay.sidecar.supervisor import (
    SidecarOptions,
    SidecarSupervisor,
    build_sidecar_endpoint,
)

logger = logging.getLogger(__name__)

START_SIDECAR = "sglang.srt.entrypoints.sidecar.start_sidecar"
SIGTERM_HANDLER = "sglang.srt.managers.tokenizer_manager.SignalHandler.sigterm_handler"


class NodeSidecar:
    """One supervised sidecar of this node, with the ``stop()`` upstream's lifespan calls.

    ``running`` is the registry the sidecar joins while it runs: its launch's
    (``NodeLaunch.sidecars``), which SIGTERM stops.
    """

    def __init__(self, supervisor: SidecarSupervisor, role: str, running: RunningSidecars) -> None:
        self.supervisor = supervisor
        self.role = role
        self.running = running
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        # A second stop() (the lifespan's, after SIGTERM began one) waits for the first.
        self._stop_lock = threading.Lock()

    def __str__(self) -> str:
        return f"{self.role} sidecar {self.supervisor.module}"

    @property
    def pid(self) -> int | None:
        return self.supervisor.pid

    def start(self) -> None:
        began = time.monotonic()
        self.supervisor.start()
        self.started_at = time.monotonic()
        self.running.add(self)
        logger.info(
            "%s sidecar %s started pid=%s endpoint=%s in %.1f ms",
            self.role,
            self.supervisor.module,
            self.supervisor.pid,
            self.supervisor.endpoint,
            (self.started_at - began) * 1000,
        )

    def stop(self) -> None:
        """Stop the sidecar (bounded by the shutdown timeout + 1 s). Idempotent, thread-safe."""
        with self._stop_lock:
            if self.stopped_at is not None:
                return
            began = time.monotonic()
            pid = self.supervisor.pid
            try:
                self.supervisor.stop()
            finally:
                self.stopped_at = time.monotonic()
                self.running.discard(self)
                logger.info(
                    "%s sidecar %s pid=%s stopped in %.1f ms",
                    self.role,
                    self.supervisor.module,
                    pid,
                    (self.stopped_at - began) * 1000,
                )

    def stop_in_background(self) -> threading.Thread:
        """Start :meth:`stop` on its own thread (signal handlers must not block the loop)."""
        thread = threading.Thread(
            target=self.stop, name=f"overlay-{self.role}-sidecar-stop", daemon=True
        )
        thread.start()
        return thread


def _node_sidecar(launch: NodeLaunch, host: str, port: int, role: str) -> NodeSidecar:
    """The launch's ``--sidecar`` against ``host:port``, with the options parsed at launch."""
    if launch.sidecar is None:
        raise ValueError(f"no --sidecar in this launch to start on the {role}")
    supervisor = SidecarSupervisor(
        launch.sidecar,
        build_sidecar_endpoint(host, port),
        launch.provider_args,
        launch.sidecar_options or SidecarOptions(),
        on_fatal=fail_stop_node,
    )
    return NodeSidecar(supervisor, role, launch.sidecars)


def start_leader_sidecar(launch: NodeLaunch) -> NodeSidecar:
    """The leader's sidecar against ``--host``/``--grpc-port`` (the listener is bound)."""
    cfg = _sglang.serving()
    sidecar = _node_sidecar(launch, str(cfg.host or ""), int(cfg.grpc_port), "leader")
    sidecar.start()
    return sidecar


def around_start_sidecar(original: Any, *args: Any, **kwargs: Any) -> Any:
    if _sglang.rust_server_enabled():
        return original(*args, **kwargs)
    # The launch hook began this node's launch before SGLang's lifespan could get here.
    return start_leader_sidecar(current_launch("the leader's start_sidecar()"))


def after_sigterm_handler(result: Any, *args: Any, **kwargs: Any) -> Any:
    """SGLang has begun its SIGTERM shutdown: stop this node's sidecars first, gracefully."""
    launch = current_launch("the SIGTERM handler's sidecar stop")
    for sidecar in launch.sidecars.snapshot():
        logger.info("SIGTERM: stopping %s before SGLang's shutdown kills the process tree", sidecar)
        sidecar.stop_in_background()
    return result


def start_follower_sidecar(
    launch: NodeLaunch, host: str, port: int, sources: list[dict[str, Any]]
) -> NodeSidecar | None:
    """Start the opt-in follower sidecar of ``launch`` against the SERVING follower metadata
    server at ``host:port``; ``sources`` is the node's ``kv_event_sources``.

    Returns None when no sidecar belongs here (no ``--sidecar``, no
    ``--sidecar-on-followers``, or no KV publisher on the node); raises when it cannot start.
    """
    module, options = launch.sidecar, launch.sidecar_options
    if module is None or options is None:
        return None
    if not options.on_followers:
        logger.info(
            "follower node: --sidecar %s runs on the leader only (add --sidecar-on-followers "
            "to --sidecar-args to run it here too)",
            module,
        )
        return None
    if not sources:
        logger.warning(
            "follower node: --sidecar %s not started: this node owns no KV-event publisher "
            "(kv_event_sources is []), and a consumer has nothing to relay here",
            module,
        )
        return None
    sidecar = _node_sidecar(launch, host, port, "follower")
    sidecar.start()
    return sidecar


# A leader launched with --sidecar installs these (``_hooks``); a follower's sidecar is
# started by its follower start (``_follower``) through start_follower_sidecar.
LEADER_HOOKS = (
    Hook(START_SIDECAR, around_start_sidecar, "AROUND"),
    Hook(SIGTERM_HANDLER, after_sigterm_handler, "AFTER"),
)
