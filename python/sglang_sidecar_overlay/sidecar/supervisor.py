"""The ``--sidecar`` supervisor: spawn, parent-death coverage, watchdog, bounded stop, restarts.

What runs where:
- In the server process, :class:`SidecarSupervisor` owns one long-lived thread
  (``sidecar-supervisor-<module>``). That thread spawns the sidecar, because PR_SET_PDEATHSIG
  follows the spawning *thread*, and then blocks on the child's pidfd (no polling interval) to
  notice an exit at once.
- The sidecar is a fresh interpreter running ``sidecar.shim`` (stdlib only) in a new session, so
  it leads its own process group before any provider code is imported. The shim forks the
  provider, which imports ``module`` and calls ``main(argv)``; the shim outlives the provider
  long enough to kill and reap whatever the provider left behind, then mirrors its exit status.
- The server's gRPC endpoint reaches the provider in the ``SGLANG_GRPC_ENDPOINT`` environment
  variable, and in ``DYN_SIDECAR_GRPC_ENDPOINT`` too unless the operator set that one (NVIDIA
  Dynamo's released sidecar reads only it or ``--grpc-endpoint``).

When it stops:
- :meth:`SidecarSupervisor.stop`: SIGTERM to the sidecar's process group (and to descendants that
  left it), up to ``shutdown_timeout``, then SIGKILL; bounded by ``shutdown_timeout + 1 s``.
- An exit nobody asked for: with policy ``never``, ``on_fatal(description)`` once; with
  ``on-failure``, a restart after an exponential backoff until the restart budget is spent.
- The server dies, even by SIGKILL: the shim sees it (PDEATHSIG, getppid, EOF on the control
  pipe) and terminates the provider's whole tree within a second.

Nothing here imports SGLang.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Literal

from sglang_sidecar_overlay.contract.endpoints import format_host_port, loopback_for
from sglang_sidecar_overlay.contract.values import is_int
from sglang_sidecar_overlay.sidecar import proctree, shim

logger = logging.getLogger(__name__)

ENDPOINT_ENV = "SGLANG_GRPC_ENDPOINT"
# NVIDIA Dynamo's sidecar (ai-dynamo 1.6.1) reads its endpoint from here or --grpc-endpoint.
DYNAMO_ENDPOINT_ENV = "DYN_SIDECAR_GRPC_ENDPOINT"

RestartPolicy = Literal["never", "on-failure"]
_RESTART_POLICIES = ("never", "on-failure")

BACKOFF_BASE = 1.0
BACKOFF_CAP = 30.0
BACKOFF_JITTER = 0.1  # up to +10 %, so restarted groups do not retry in lockstep

# Grace after the SIGKILL for the kernel to tear the group down; part of the ``+ 1 s`` bound.
_KILL_GRACE = 1.0

_BOOTSTRAP = (
    "import sys; sys.path.insert(0, sys.argv[2]); "
    "from sglang_sidecar_overlay.sidecar.shim import main; main()"
)


def sidecar_environment(environ: Mapping[str, str], endpoint: str) -> dict[str, str]:
    """The sidecar's environment: ``environ`` plus the endpoint in both variables.

    ``SGLANG_GRPC_ENDPOINT`` is always this server's; ``DYN_SIDECAR_GRPC_ENDPOINT`` only when
    the operator did not set it.
    """
    env = {**environ, ENDPOINT_ENV: endpoint}
    env.setdefault(DYNAMO_ENDPOINT_ENV, endpoint)
    return env


def build_sidecar_endpoint(host: str, port: int) -> str:
    """The URL a sidecar on this node uses to reach the server: wildcard hosts become loopback.

    ``""``, ``*`` and ``0.0.0.0`` -> ``127.0.0.1``; ``::`` -> ``::1``; IPv6 is bracketed.
    """
    if not 0 < int(port) < 65536:
        raise ValueError(f"sidecar endpoint port {port!r} is not in 1..65535")
    return f"http://{format_host_port(loopback_for(host), int(port))}"


@dataclasses.dataclass(frozen=True)
class SidecarOptions:
    """Supervisor settings, parsed out of SGLang's ``sidecar_args`` list."""

    shutdown_timeout: float = 45.0
    restart: RestartPolicy = "never"
    max_restarts: int = 3
    restart_window: float = 300.0
    on_followers: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.shutdown_timeout, (int, float)) and self.shutdown_timeout > 0):
            raise ValueError(
                f"--sidecar-shutdown-timeout must be > 0, got {self.shutdown_timeout!r}"
            )
        if not math.isfinite(self.shutdown_timeout):
            raise ValueError(
                f"--sidecar-shutdown-timeout must be finite, got {self.shutdown_timeout}"
            )
        if self.restart not in _RESTART_POLICIES:
            raise ValueError(
                f"--sidecar-restart must be one of {', '.join(_RESTART_POLICIES)}, "
                f"got {self.restart!r}"
            )
        if not is_int(self.max_restarts):
            raise ValueError(
                f"--sidecar-max-restarts must be an integer, got {self.max_restarts!r}"
            )
        if self.max_restarts < 0:
            raise ValueError(f"--sidecar-max-restarts must be >= 0, got {self.max_restarts}")
        window = self.restart_window
        if not (isinstance(window, (int, float)) and window > 0 and math.isfinite(window)):
            raise ValueError(
                f"--sidecar-restart-window must be a finite number > 0, got {window!r}"
            )

    @classmethod
    def from_args(cls, sidecar_args: list[str]) -> tuple[SidecarOptions, list[str]]:
        """Split ``sidecar_args`` into our options and the provider's arguments (kept in order).

        Recognised: ``--sidecar-shutdown-timeout S``, ``--sidecar-restart never|on-failure``,
        ``--sidecar-max-restarts N``, ``--sidecar-restart-window S`` (each also as
        ``--opt=value``) and the flag ``--sidecar-on-followers``. A ``--`` ends option parsing;
        it and everything after it belong to the provider. Bad values raise ValueError.
        """
        converters: dict[str, tuple[str, Callable[[str], object]]] = {
            "--sidecar-shutdown-timeout": ("shutdown_timeout", float),
            "--sidecar-restart": ("restart", str),
            "--sidecar-max-restarts": ("max_restarts", int),
            "--sidecar-restart-window": ("restart_window", float),
        }
        values: dict[str, object] = {}
        rest: list[str] = []
        args = list(sidecar_args)
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                rest.extend(args[i:])
                break
            name, eq, inline = arg.partition("=")
            if name == "--sidecar-on-followers":
                if eq:
                    raise ValueError("--sidecar-on-followers is a flag and takes no value")
                values["on_followers"] = True
            elif name in converters:
                field, convert = converters[name]
                if eq:
                    raw = inline
                elif i + 1 < len(args):
                    i += 1
                    raw = args[i]
                else:
                    raise ValueError(f"{name} needs a value")
                try:
                    values[field] = convert(raw)
                except ValueError:
                    raise ValueError(f"{name}: invalid value {raw!r}") from None
            else:
                rest.append(arg)
            i += 1
        return cls(**values), rest  # type: ignore[arg-type]


def backoff_delay(restarts_in_window: int, rng: random.Random | None = None) -> float:
    """Delay before the next restart: 1 s doubling per recent restart, capped at 30 s, + jitter."""
    base = min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** max(0, restarts_in_window))
    return base * (1.0 + (rng or random).uniform(0.0, BACKOFF_JITTER))


class RestartBudget:
    """At most ``max_restarts`` restarts within any ``window`` seconds (supervisord's FATAL)."""

    def __init__(self, max_restarts: int, window: float) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self._times: collections.deque[float] = collections.deque()

    def recent(self, now: float) -> int:
        """Restarts within the window ending at ``now``; older ones no longer count."""
        while self._times and now - self._times[0] >= self.window:
            self._times.popleft()
        return len(self._times)

    def try_spend(self, now: float) -> bool:
        """Record a restart at ``now`` if the budget allows one; False means give up."""
        if self.recent(now) >= self.max_restarts:
            return False
        self._times.append(now)
        return True


def describe_exit(returncode: int, expected: bool = False) -> str:
    """``exited with code 3`` / ``killed by SIGSEGV`` / ``exited cleanly (code 0) ...``."""
    if returncode < 0:
        return f"killed by {proctree.signal_name(-returncode) or f'signal {-returncode}'}"
    if returncode == 0 and not expected:
        return "exited cleanly (code 0) while the server was running"
    return f"exited with code {returncode}"


class SidecarSupervisor:
    """Owns one sidecar process (and its restarts) for the lifetime of the server."""

    def __init__(
        self,
        module: str,
        endpoint: str,
        provider_args: list[str],
        options: SidecarOptions,
        on_fatal: Callable[[str], None],
    ) -> None:
        if not module or not all(part.isidentifier() for part in module.split(".")):
            raise ValueError(f"sidecar module {module!r} is not a dotted Python module name")
        self.module = module
        self.endpoint = endpoint
        self.provider_args = list(provider_args)
        self.options = options
        self.on_fatal = on_fatal

        # Re-entrant: stop() may run in a signal handler that interrupted this same thread
        # while it held the lock (_stop then sees its own stop in progress and returns).
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pidfd = -1
        self._control_w = -1
        self._wake_r, self._wake_w = os.pipe()
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._stopping = False
        self._stopper: int | None = None
        self._stopped = threading.Event()
        self._restarts = 0
        self._budget = RestartBudget(options.max_restarts, options.restart_window)

    # -- public API ----------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """Pid of the sidecar's group leader (the shim), or None when none is running."""
        proc = self._proc
        return proc.pid if proc is not None else None

    @property
    def restarts(self) -> int:
        """Restarts performed so far (over the supervisor's whole life)."""
        return self._restarts

    def is_alive(self) -> bool:
        """True while a sidecar process exists and has not exited."""
        with self._lock:
            if self._proc is None or self._pidfd < 0:
                return False
            return not _readable(self._pidfd, 0)

    def start(self) -> None:
        """Spawn the sidecar from the supervisor thread; raises if the first spawn fails."""
        with self._lock:
            if self._thread is not None:
                raise RuntimeError(f"sidecar {self.module!r} was already started")
            if self._stopping:
                raise RuntimeError(f"sidecar {self.module!r} was stopped before it started")
            self._thread = threading.Thread(
                target=self._run, name=f"sidecar-supervisor-{self.module}", daemon=True
            )
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error

    def stop(self) -> None:
        """Stop the sidecar: SIGTERM its group, wait ``shutdown_timeout``, SIGKILL, reap.

        Idempotent and thread-safe; never raises (failures are logged). Returns within
        ``shutdown_timeout + 1 s``.
        """
        try:
            self._stop()
        except Exception:
            logger.exception("stopping sidecar %r failed", self.module)

    # -- stop ----------------------------------------------------------------------------------

    def _stop(self) -> None:
        me = threading.get_ident()
        with self._lock:
            if self._stopping:
                # Re-entered (a SIGTERM handler interrupting our own stop) or the supervisor
                # thread itself (on_fatal calling stop): waiting here would deadlock.
                if me in (self._stopper, self._thread_ident()):
                    return
                wait = True
            else:
                # Marked first, so the watchdog treats the coming exit as intended and a
                # pending restart is abandoned.
                self._stopping = True
                self._stopper = me
                wait = False
                thread = self._thread
                if self._wake_w >= 0:
                    os.write(self._wake_w, b"x")
        if wait:
            self._stopped.wait(self.options.shutdown_timeout + _KILL_GRACE)
            return
        try:
            if thread is None:
                self._close_wake_pipe()  # never started: the thread will not close it
                return
            if me == self._thread_ident():
                return
            deadline = time.monotonic() + self.options.shutdown_timeout
            if self._signal_tree(signal.SIGTERM, "SIGTERM"):
                thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                logger.warning(
                    "sidecar %r did not exit within %.1f s of SIGTERM; sending SIGKILL",
                    self.module,
                    self.options.shutdown_timeout,
                )
                self._signal_tree(signal.SIGKILL, "SIGKILL")
                thread.join(_KILL_GRACE)
            if thread.is_alive():
                logger.error("sidecar %r (pid %s) survived SIGKILL", self.module, self.pid)
        finally:
            self._stopped.set()

    def _thread_ident(self) -> int | None:
        return self._thread.ident if self._thread is not None else None

    def _signal_tree(self, sig: int, name: str) -> bool:
        """Signal the sidecar's group and its descendants that left the group. False if none."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return False
            # The tree is walked before the group is signalled, while every member still has
            # its parent; the leader is unreaped, so the group id cannot have been reused.
            table = proctree.process_table()
            strays = [
                key
                for key in proctree.descendants(proc.pid, table)
                if table[key[0]].pgrp != proc.pid
            ]
            logger.info("sending %s to sidecar %r (group %d)", name, self.module, proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            proctree.signal_processes(strays, sig)
            return True

    # -- supervisor thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._spawn()
        except BaseException as exc:
            self._start_error = exc
            self._started.set()
            self._close_wake_pipe()
            return
        self._started.set()
        try:
            while self._proc is not None:
                returncode = self._wait_exit()
                if self._stopping:
                    logger.info(
                        "sidecar %r stopped (%s)", self.module, describe_exit(returncode, True)
                    )
                    return
                description = f"sidecar {self.module!r} {describe_exit(returncode)}"
                if not self._restart_after(description):
                    self._fatal(description)
                    return
        finally:
            self._close_wake_pipe()

    def _close_wake_pipe(self) -> None:
        with self._lock:
            if self._wake_r < 0:
                return
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    def _spawn(self) -> None:
        """Start the shim. Runs only on the supervisor thread (PDEATHSIG follows it)."""
        spec = {"module": self.module, "argv": self.provider_args, "sys_path": list(sys.path)}
        package_root = os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.abspath(shim.__file__)))
        )
        control_r, control_w = os.pipe()
        try:
            with self._lock:
                if self._stopping:
                    raise RuntimeError(f"sidecar {self.module!r} is stopping")
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _BOOTSTRAP,
                        f"sglang-sidecar:{self.module}",
                        package_root,
                        str(os.getpid()),
                        str(control_r),
                    ],
                    stdin=subprocess.DEVNULL,
                    env=sidecar_environment(os.environ, self.endpoint),
                    pass_fds=(control_r,),
                    start_new_session=True,
                )
                self._proc = proc
                self._pidfd = os.pidfd_open(proc.pid)
                self._control_w = control_w
        except BaseException:
            os.close(control_w)
            raise
        finally:
            os.close(control_r)
        logger.info(
            "started sidecar %r (pid %d, endpoint %s)", self.module, proc.pid, self.endpoint
        )
        # The write end stays open for the sidecar's life: its EOF tells the shim we are gone.
        with contextlib.suppress(BrokenPipeError):
            os.write(control_w, json.dumps(spec).encode() + b"\n")

    def _wait_exit(self) -> int:
        """Block until the sidecar exits; clean up its group; reap it and return its code."""
        proc = self._proc
        assert proc is not None
        _readable(self._pidfd, None)
        with self._lock:
            # Still a zombie here, so its group id is ours: sweep anything the shim could not
            # (for instance when the shim itself was SIGKILLed).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait()
            os.close(self._pidfd)
            os.close(self._control_w)
            self._pidfd = self._control_w = -1
            self._proc = None
        return returncode

    def _restart_after(self, description: str) -> bool:
        """Apply the restart policy to an unexpected exit. False -> give up."""
        if self.options.restart == "never":
            return False
        now = time.monotonic()
        recent = self._budget.recent(now)
        if not self._budget.try_spend(now):
            logger.error(
                "%s; %d restarts within %.0f s, giving up",
                description,
                recent,
                self.options.restart_window,
            )
            return False
        delay = backoff_delay(recent)
        logger.warning("%s; restarting in %.1f s", description, delay)
        # The wake pipe makes stop() cut the backoff short.
        if _readable(self._wake_r, delay):
            return True  # stopping: no process is left, so the thread ends
        try:
            self._spawn()
        except Exception:
            if self._stopping:
                return True
            logger.exception("restarting sidecar %r failed", self.module)
            return self._restart_after(f"sidecar {self.module!r} could not be restarted")
        self._restarts += 1
        return True

    def _fatal(self, description: str) -> None:
        logger.error("%s", description)
        try:
            self.on_fatal(description)
        except Exception:
            logger.exception("sidecar on_fatal callback failed")


def _readable(fd: int, timeout: float | None) -> bool:
    """Wait until ``fd`` is readable (poll, not select: a server may hold more than 1024 fds)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))
