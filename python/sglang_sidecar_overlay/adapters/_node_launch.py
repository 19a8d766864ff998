"""One launch of one node, and the one place an SGLang process keeps the overlay's state.

:class:`NodeLaunch` is made once, where a node's launch begins (the engine's scheduler-launch
hook, ``_launch.begin_node_launch``), and holds everything that launch decided or started:
its incarnation, its role and hook plan, the ``dp_size`` switch (decided once), the
``--sidecar`` module with its options (parsed once), the scheduler processes once spawned,
and the sidecars running on the node.

:data:`PROCESS` is the process's only module-level state: the plugin's idempotence guard (the
adapter it loaded), the launch-time hook groups applied in this process and the node launch
running now. The launch hook hands its launch to everything downstream as an argument (the
follower start, the server-info builder, the sidecars). The hooks SGLang calls with no object
of ours (``start_sidecar()``, the SIGTERM handler, the follower server's start,
``GetServerInfo``, ``/server_info``) get it from :func:`current_launch`, which raises when no
launch began; nothing begins a launch implicitly. An engine process launches one node at a
time.

An engine built outside SGLang's launch path (no ``Engine._launch_scheduler_processes``, so
no launch hook) gets that error from the first hook that needs its launch; code that builds
one on purpose (an in-process test, a benchmark) calls ``_launch.begin_node_launch(server_args)``
first, as the launch hook would.

This module imports no other adapter module: every adapter module can read
the launch without stacking another file under it.

What a launch hands the processes it spawns is one variable (``_hooks.CHILD_LAUNCH_ENV``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from sglang_sidecar_overlay.contract.incarnation import Incarnation
    from sglang_sidecar_overlay.server.follower import FollowerMetadataServer
    from sglang_sidecar_overlay.sidecar.supervisor import SidecarOptions


class LaunchPlan(NamedTuple):
    """The hook groups of one launch (``_plan.launch_plan``'s rule): installed in the engine
    process, and in its children."""

    launch: tuple[str, ...]
    children: tuple[str, ...]

    @property
    def side_channel(self) -> bool:
        """Whether the children hand their sources back through the side channel."""
        return "sources" in self.children


class Sidecar(Protocol):
    """What SIGTERM needs of a running sidecar (``_sidecar.NodeSidecar``)."""

    def stop_in_background(self) -> threading.Thread: ...


class RunningSidecars:
    """The sidecars of a launch started and not stopped yet: what SIGTERM has to stop.

    A :class:`~sglang_sidecar_overlay.adapters._sidecar.NodeSidecar` adds itself once started
    and removes itself once stopped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sidecars: set[Sidecar] = set()

    def add(self, sidecar: Sidecar) -> None:
        with self._lock:
            self._sidecars.add(sidecar)

    def discard(self, sidecar: Sidecar) -> None:
        with self._lock:
            self._sidecars.discard(sidecar)

    def __contains__(self, sidecar: object) -> bool:
        with self._lock:
            return sidecar in self._sidecars

    def snapshot(self) -> list[Sidecar]:
        """The running sidecars now (a copy: stopping one changes the set)."""
        with self._lock:
            return list(self._sidecars)


class NodeLaunch:
    """One launch of one node in its engine process (see the module docstring)."""

    def __init__(
        self,
        incarnation: Incarnation,
        plan: LaunchPlan,
        *,
        follower: bool,
        legacy_dp_size: bool,
        sidecar: str | None = None,
        sidecar_options: SidecarOptions | None = None,
        provider_args: Iterable[str] = (),
    ) -> None:
        self.incarnation = incarnation
        self.plan = plan
        self.follower = follower
        self.legacy_dp_size = legacy_dp_size
        self.sidecar = sidecar
        self.sidecar_options = sidecar_options
        self.provider_args = list(provider_args)
        self.sidecars = RunningSidecars()
        self.init_result: Any = None
        self.procs: list[Any] = []
        self.follower_server: FollowerMetadataServer | None = None  # a follower's, once started

    def record_schedulers(self, init_result: Any, procs: Any) -> None:
        """What SGLang's scheduler launch returned: its ready handle and its processes."""
        self.init_result = init_result
        self.procs = list(procs or [])

    def scheduler_pids(self) -> list[int]:
        """The node's scheduler (or DP controller) pids, as SGLang reports them."""
        pids = list(getattr(self.init_result, "all_child_pids", None) or [])
        return pids or [proc.pid for proc in self.procs]


class OverlayProcess:
    """The overlay's state in one SGLang process (:data:`PROCESS`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaded = False
        self.adapter: str | None = None
        self.launch: NodeLaunch | None = None
        # The launch-time hook groups applied in this process (each once; ``_hooks``).
        self.installed_hooks: set[str] = set()
        self.hooks_lock = threading.Lock()


PROCESS = OverlayProcess()


class NoLaunchError(RuntimeError):
    """A hook that needs its node's launch ran in a process where no launch began."""


def announce_launch(launch: NodeLaunch) -> None:
    """``launch`` is this process's node launch from now on (``_launch.begin_node_launch``)."""
    PROCESS.launch = launch


def current_launch(needed_by: str) -> NodeLaunch:
    """The node launch running in this process, for the hook ``needed_by``; raises
    :class:`NoLaunchError` naming that hook and the cause when no launch began here."""
    launch = PROCESS.launch
    if launch is None:
        raise NoLaunchError(
            f"{needed_by} needs this node's launch, but no launch began in this process: the "
            "overlay begins one in its hook on SGLang's Engine._launch_scheduler_processes, "
            "which did not run here (an engine built outside SGLang's launch path). Call "
            "sglang_sidecar_overlay.adapters._launch.begin_node_launch(server_args) before "
            "serving such an engine."
        )
    return launch
