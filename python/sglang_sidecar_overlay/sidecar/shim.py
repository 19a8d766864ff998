"""The group-leading shim that runs a ``--sidecar`` provider (child side; stdlib only).

What runs where: the server's supervisor thread (``supervisor.py``) starts this module in a
fresh interpreter, in a new session, so this shim leads the sidecar's process group. The shim
becomes a child subreaper, arms PR_SET_PDEATHSIG, re-checks ``getppid()``, reads the launch spec
from the control pipe, then forks the provider: the fork imports the provider module and calls
its ``main(argv)``. The shim itself never runs provider code, so it can always clean up.

When it stops:
- the provider exits -> every remaining descendant is SIGKILLed and reaped, then the shim exits
  with the provider's status (same code, or killed by the same signal);
- the server goes away (PDEATHSIG, EOF on the control pipe, or a changed parent pid) -> the
  descendants get SIGTERM, a short grace, then SIGKILL; the shim exits.
SIGTERM/SIGINT sent to the shim do not end it: the server signals the whole group, and the shim
waits for the provider so that its status is mirrored faithfully.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import resource
import select
import signal
import sys
import time
import traceback
from collections.abc import Iterable
from typing import Any, NoReturn

from sglang_sidecar_overlay.sidecar.proctree import (
    ProcKey,
    descendants,
    group_members,
    process_table,
    signal_processes,
)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

# Delivered by the kernel when the server's supervisor thread (our parent) dies.
PARENT_DEATH_SIGNAL = signal.SIGHUP
# How long the provider gets to exit on SIGTERM once the server is gone.
PARENT_GONE_GRACE = 0.5
# Bound on reaping the provider's leftovers, so a process stuck in the kernel cannot hold up
# the report of the provider's exit.
LEFTOVER_REAP_TIMEOUT = 1.0

# Exit codes of the provider process for launch-contract failures.
EXIT_IMPORT_FAILED = 2
EXIT_BAD_MAIN = 3

_HANDLED_SIGNALS = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, PARENT_DEATH_SIGNAL)


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def _read_spec(fd: int) -> dict[str, Any] | None:
    """The launch spec: one JSON line. None if the server closed the pipe first."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        buf += chunk
    spec: dict[str, Any] = json.loads(buf)
    return spec


def _fail(message: str, code: int) -> NoReturn:
    sys.stderr.write(f"sglang sidecar: {message}\n")
    sys.stderr.flush()
    raise SystemExit(code)


def _become_provider(spec: dict[str, Any], shim_pid: int, inherited_fds: Iterable[int]) -> None:
    """Runs in the forked provider process; ends the process (never returns)."""
    signal.set_wakeup_fd(-1)
    for sig in _HANDLED_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in inherited_fds:
        os.close(fd)
    # The shim runs a single thread for its whole life, so this signal means the shim died.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != shim_pid:
        os._exit(1)

    module_name = spec["module"]
    sys.path[:] = spec["sys_path"]
    sys.argv = [module_name, *spec["argv"]]
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        traceback.print_exc()
        _fail(
            f"cannot import provider module {module_name!r}: {type(exc).__name__}: {exc}",
            EXIT_IMPORT_FAILED,
        )
    main = getattr(module, "main", None)
    if main is None:
        _fail(f"provider module {module_name!r} has no main(argv) function", EXIT_BAD_MAIN)
    if not callable(main):
        _fail(
            f"provider module {module_name!r}: main is not callable "
            f"(it is a {type(main).__name__})",
            EXIT_BAD_MAIN,
        )
    # sys.exit semantics: None -> 0, an int -> that code; exceptions propagate normally, so
    # the interpreter prints them, runs atexit hooks and exits 1.
    raise SystemExit(main(list(spec["argv"])))


class _Shim:
    def __init__(self, parent_pid: int, control_fd: int) -> None:
        self.parent_pid = parent_pid
        self.control_fd = control_fd
        self.pid = os.getpid()
        self.provider_pid = 0
        self.provider_status: int | None = None
        self.parent_gone = False
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)

    def arm(self) -> bool:
        """Install signal handling and parent-death detection. False if the parent is gone."""
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for sig in _HANDLED_SIGNALS:
            # A no-op handler: the wakeup fd carries the signal number to the select loop.
            signal.signal(sig, lambda *_: None)
        # Orphaned descendants (including those that called setsid) are re-parented to us, so
        # the whole tree stays findable and reapable after the provider dies.
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        _prctl(_PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL)
        # PDEATHSIG is not sent if the parent died before prctl: check by hand once armed.
        return os.getppid() == self.parent_pid

    def supervise(self) -> None:
        """Wait for the provider's exit or the server's disappearance, then clean up and exit."""
        watched = [self.wake_r, self.control_fd]
        while self.provider_status is None and not self.parent_gone:
            readable, _, _ = select.select(watched, [], [])
            if self.control_fd in readable and not os.read(self.control_fd, 4096):
                self.parent_gone = True
                watched.remove(self.control_fd)
            if self.wake_r in readable:
                signums = os.read(self.wake_r, 4096)
                if PARENT_DEATH_SIGNAL in signums:
                    self.parent_gone = True
            if os.getppid() != self.parent_pid:
                self.parent_gone = True
            self._reap()
        if self.provider_status is None:
            self._terminate_tree()
            os._exit(128 + PARENT_DEATH_SIGNAL)
        self._kill_leftovers()
        self._mirror(self.provider_status)

    def _reap(self, block_until: float | None = None) -> bool:
        """Reap exited children; True once no child is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                if block_until is None:
                    return False
                remaining = block_until - time.monotonic()
                if remaining <= 0:
                    return False
                # SIGCHLD lands on the wakeup fd; other signals only end the wait early.
                if select.select([self.wake_r], [], [], remaining)[0]:
                    os.read(self.wake_r, 4096)
                continue
            if pid == self.provider_pid:
                self.provider_status = status

    def _kill_tree(self, sig: int) -> list[ProcKey]:
        table = process_table()
        keys = descendants(self.pid, table)
        keys += [k for k in group_members(self.pid, table) if k[0] != self.pid and k not in keys]
        signal_processes(keys, sig)
        return keys

    def _kill_leftovers(self) -> None:
        deadline = time.monotonic() + LEFTOVER_REAP_TIMEOUT
        # Repeat: a leftover may fork between our scan and its death.
        while self._kill_tree(signal.SIGKILL) and time.monotonic() < deadline:
            self._reap(block_until=min(deadline, time.monotonic() + 0.05))
        self._reap(block_until=deadline)

    def _terminate_tree(self) -> None:
        self._kill_tree(signal.SIGTERM)
        deadline = time.monotonic() + PARENT_GONE_GRACE
        while self.provider_status is None and time.monotonic() < deadline:
            self._reap(block_until=deadline)
            if self.provider_status is None and not self._kill_tree(0):
                break
        self._kill_leftovers()

    def _mirror(self, status: int) -> None:
        sys.stderr.flush()
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            signal.set_wakeup_fd(-1)
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
            # Mirror the signal without writing a second core dump.
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.kill(self.pid, sig)
            os._exit(128 + sig)  # only reached for signals whose default is not to terminate
        os._exit(os.waitstatus_to_exitcode(status))


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``<marker> <parent pid> <control fd>``."""
    argv = sys.argv[1:] if argv is None else argv
    parent_pid, control_fd = int(argv[-2]), int(argv[-1])
    shim = _Shim(parent_pid, control_fd)
    if not shim.arm():
        os._exit(128 + PARENT_DEATH_SIGNAL)
    spec = _read_spec(control_fd)
    if spec is None:
        os._exit(128 + PARENT_DEATH_SIGNAL)
    # No try/finally around the fork: in the provider, SystemExit must unwind straight to the
    # interpreter so atexit hooks and exit codes behave as in a plain ``python -m``.
    pid = os.fork()
    if pid == 0:
        _become_provider(spec, shim.pid, (shim.wake_r, shim.wake_w, control_fd))
    shim.provider_pid = pid
    shim.supervise()


if __name__ == "__main__":
    main()
