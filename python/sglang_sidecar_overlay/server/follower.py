"""Lifecycle of a follower node's metadata server (GetServerInfo + grpc.health.v1 + reflection).

Runs in the engine process of a follower node (``node_rank >= 1``), started only after every
local scheduler has reported ready, with the node's server-info snapshot. Order on start:
bind and install the snapshot (health NOT_SERVING), then flip health to SERVING, then watch
the node's scheduler processes. When any of them exits the node can no longer serve, so
health goes NOT_SERVING at once; the server is stopped when all of them are gone (or after a
short linger, so health watchers see NOT_SERVING before the port closes). ``stop()`` is
idempotent and safe from any thread.

A bind failure raises ``OSError`` naming the address, and a scheduler that has already exited
when the server would go live (a crash between the node's readiness and this start) raises
``RuntimeError`` naming its pid; reaping the node's scheduler processes is the caller's job
(it owns them). Pure core: nothing here imports SGLang.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import os
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, cast

from sglang_sidecar_overlay.contract.endpoints import format_host_port

if TYPE_CHECKING:
    # The native module is imported only when a server starts (``_native_start``).
    from sglang_sidecar_overlay._native import MetadataServer

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_LINGER_S", "FollowerMetadataServer", "start_follower_server"]

# How long the server keeps answering NOT_SERVING after the first scheduler exit while
# the others are still going down.
DEFAULT_LINGER_S = 5.0


StartFn = Callable[[str, int, str], "MetadataServer"]


def _native_start(host: str, port: int, server_info_json: str) -> MetadataServer:
    from sglang_sidecar_overlay import _native

    return _native.start_metadata_server(host, port, server_info_json)


class FollowerMetadataServer:
    """One follower metadata server bound to the lifetime of a set of scheduler processes."""

    def __init__(
        self, server: MetadataServer, pids: Iterable[int], *, linger_s: float = DEFAULT_LINGER_S
    ) -> None:
        self._server = server
        self._pids = sorted({int(pid) for pid in pids})
        self._linger_s = linger_s
        self._lock = threading.Lock()
        self._stopped = False
        self._stop_done = threading.Event()
        self._stopper: int | None = None
        self._wake_r, self._wake_w = os.pipe()
        self._pidfds: dict[int, int] = {}
        self._watcher: threading.Thread | None = None
        self._before_stop: list[Callable[[], None]] = []
        self.exited_pid: int | None = None

    @property
    def host(self) -> str:
        return self._server.host

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def address(self) -> str:
        return format_host_port(self.host, self.port)

    def add_before_stop(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` first on every stop path, before the server stops (last added runs
        first). A callback that raises is logged; the server still stops."""
        self._before_stop.insert(0, callback)

    def is_alive(self) -> bool:
        return self._server.is_alive()

    def _open_pidfds(self) -> bool:
        """Open a pidfd per scheduler; False when one has already exited (reaped or not)."""
        for pid in self._pids:
            try:
                self._pidfds[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                self.exited_pid = pid
                return False
        # A pidfd opens on an exited but unreaped child too; it is readable at once then.
        exited = multiprocessing.connection.wait(list(self._pidfds.values()), timeout=0)
        if exited:
            # Only pidfds were waited on.
            self.exited_pid = {fd: pid for pid, fd in self._pidfds.items()}[cast(int, exited[0])]
            return False
        return True

    def _go_live(self) -> None:
        if not self._open_pidfds():
            message = (
                f"scheduler process {self.exited_pid} exited before the follower metadata "
                f"server at {self.address} went live; the node cannot serve"
            )
            logger.error("%s", message)
            self.stop()
            raise RuntimeError(message)
        # SERVING only once the snapshot is installed and every scheduler is known alive.
        self._server.set_serving(True)
        logger.info(
            "follower metadata server at %s is SERVING (watching schedulers %s)",
            self.address,
            self._pids,
        )
        self._watcher = threading.Thread(
            target=self._watch, name="overlay-follower-watch", daemon=True
        )
        self._watcher.start()

    def _watch(self) -> None:
        waitables = [self._wake_r, *self._pidfds.values()]
        ready = multiprocessing.connection.wait(waitables)
        if self._wake_r in ready:
            return
        by_fd = {fd: pid for pid, fd in self._pidfds.items()}
        self.exited_pid = by_fd.get(cast(int, ready[0]))
        self._server.set_serving(False)
        logger.warning(
            "scheduler process %s exited; follower metadata server at %s is NOT_SERVING",
            self.exited_pid,
            self.address,
        )
        # Stop once every scheduler is gone, or after the linger: an orderly shutdown takes
        # the others down within moments, and a lone crash must not keep the port forever.
        remaining = [fd for fd in self._pidfds.values() if fd not in ready]
        deadline_left = self._linger_s
        while remaining and deadline_left > 0:
            step = min(deadline_left, 0.5)
            woke = multiprocessing.connection.wait([self._wake_r, *remaining], timeout=step)
            if self._wake_r in woke:
                return
            remaining = [fd for fd in remaining if fd not in woke]
            deadline_left -= step
        self.stop()

    def stop(self) -> None:
        """Health NOT_SERVING, server stopped, watcher ended. Idempotent.

        A second caller returns only once the first one's stop has finished (its sidecar
        stopped, each step bounded), so a node that exits right after ``stop()`` never cuts a
        stop the scheduler watcher began short. Neither the watcher (the first stopper joins it)
        nor the stopping thread itself (a signal handler re-entering) waits.
        """
        me = threading.get_ident()
        with self._lock:
            first = not self._stopped
            self._stopped = True
            if first:
                self._stopper = me
        if not first:
            watcher = self._watcher
            if me != self._stopper and (watcher is None or me != watcher.ident):
                self._stop_done.wait()
            return
        try:
            self._stop_once()
        finally:
            self._stop_done.set()

    def _stop_once(self) -> None:
        for callback in self._before_stop:
            try:
                callback()
            except Exception:
                logger.exception("before-stop callback of %s failed", self.address)
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        try:
            self._server.shutdown()
        finally:
            watcher = self._watcher
            if watcher is not None and watcher is not threading.current_thread():
                watcher.join(timeout=5.0)
            for fd in [*self._pidfds.values(), self._wake_r, self._wake_w]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._pidfds.clear()
            logger.info("follower metadata server at %s stopped", self.address)

    # SGLang 0.5.22+ stops its follower server handle through ``shutdown()``.
    shutdown = stop

    def __enter__(self) -> FollowerMetadataServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_follower_server(
    host: str,
    port: int,
    server_info_json: str,
    scheduler_pids: Iterable[int],
    *,
    linger_s: float = DEFAULT_LINGER_S,
    start: StartFn | None = None,
) -> FollowerMetadataServer:
    """Bind, install the snapshot, go SERVING, and watch ``scheduler_pids``.

    Raises ``OSError`` (errno kept) naming ``host:port`` when the address cannot be bound,
    ``ValueError`` for a bad host or snapshot, ``RuntimeError`` naming the pid when a
    scheduler has already exited. Nothing is left running on failure.
    """
    start = start or _native_start
    try:
        server = start(host, port, server_info_json)
    except OSError as exc:
        address = format_host_port(host, port)
        message = str(exc)
        if address not in message:
            message = f"follower metadata server cannot bind {address}: {message}"
        raise OSError(exc.errno, message) from exc
    follower = FollowerMetadataServer(server, scheduler_pids, linger_s=linger_s)
    try:
        follower._go_live()
    except BaseException:
        follower.stop()
        raise
    return follower
