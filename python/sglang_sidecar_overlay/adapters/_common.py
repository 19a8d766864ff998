"""Helpers every adapter shares: SGLang objects in, plain data out, core calls.

Imported only by an adapter, so only where SGLang is installed; SGLang modules are still
imported inside the functions, because the plugin loads in every SGLang process and most
of them never reach these paths. Runs in three places: scheduler processes (publisher
endpoints, ready info), the engine process (aggregation, follower server, leader builder)
and, through the side channel, between the two across a DP controller.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sglang_sidecar_overlay import metadata
from sglang_sidecar_overlay.adapters import _sidecar
from sglang_sidecar_overlay.follower import FollowerMetadataServer, start_follower_server
from sglang_sidecar_overlay.kv_sources import aggregate_sources, describe_source

logger = logging.getLogger("sglang_sidecar_overlay.adapters")

# Set by the engine process before its schedulers (or DP controller) spawn; every scheduler
# of the launch inherits it and drops its ready-time sources there.
SOURCES_DIR_ENV = "SGLANG_SIDECAR_OVERLAY_KV_SOURCES_DIR"
# Attributes the publisher hook sets on a ZmqEventPublisher (a plain class, not slotted).
PUB_ENDPOINT_ATTR = "_sidecar_overlay_pub_endpoint"
REPLAY_ENDPOINT_ATTR = "_sidecar_overlay_replay_endpoint"


# --- serving mode ------------------------------------------------------------------------------


def serving() -> Any:
    from sglang.srt.runtime_context import get_serving

    return get_serving()


def native_grpc_enabled() -> bool:
    """``--grpc-port`` set and neither SMG nor legacy gRPC mode: sources are advertised."""
    cfg = serving()
    if getattr(cfg, "grpc_port", None) is None:
        return False
    return not (getattr(cfg, "smg_grpc_mode", False) or getattr(cfg, "grpc_mode", False))


def rust_server_enabled() -> bool:
    from sglang.srt.environ import envs

    return bool(envs.SGLANG_RUST_SERVER.get())


def node_rank() -> int:
    from sglang.srt.runtime_context import get_parallel

    return int(get_parallel().node_rank or 0)


# --- publisher side (scheduler process) --------------------------------------------------------


def _should_bind(endpoint: str) -> bool:
    """SGLang 0.5.19–0.5.21's bind-or-connect rule for a publisher endpoint."""
    return (
        "*" in endpoint
        or "::" in endpoint
        or "0.0.0.0" in endpoint
        or endpoint.startswith(("ipc://", "inproc://"))
    )


def record_bound_endpoints(publisher: Any) -> None:
    """Read back what the publisher's sockets bound to, in the thread that created them."""
    import zmq

    pub = getattr(publisher, "_pub", None)
    endpoint = getattr(publisher, "_endpoint", "") or ""
    bound = None
    if pub is not None and _should_bind(endpoint):
        bound = pub.getsockopt_string(zmq.LAST_ENDPOINT)
    setattr(publisher, PUB_ENDPOINT_ATTR, bound)
    replay = getattr(publisher, "_replay", None)
    setattr(
        publisher,
        REPLAY_ENDPOINT_ATTR,
        replay.getsockopt_string(zmq.LAST_ENDPOINT) if replay is not None else None,
    )


def publisher_sources(kv_publisher: Any, block_size: int) -> list[dict]:
    """``[source]`` for a scheduler's bound ZMQ publisher, ``[]`` for none or connect-style."""
    publisher = getattr(kv_publisher, "kv_event_publisher", None)
    if publisher is None:
        return []
    topic_bytes = getattr(publisher, "_topic_bytes", b"")
    source = describe_source(
        int(publisher._dp_rank),
        getattr(publisher, PUB_ENDPOINT_ATTR, None),
        topic_bytes.decode("utf-8"),
        block_size,
        getattr(publisher, REPLAY_ENDPOINT_ATTR, None),
    )
    return [source] if source is not None else []


def scheduler_block_size(scheduler: Any) -> int:
    """page_size × dcp_size, the size a router must hash with."""
    from sglang.srt.runtime_context import get_parallel

    dcp_size = getattr(get_parallel(), "dcp_size", None) or 1
    return int(scheduler.page_size) * int(dcp_size)


def write_side_channel(sources: list[dict]) -> None:
    """Drop this scheduler's sources where its engine process will look (atomic rename)."""
    directory = os.environ.get(SOURCES_DIR_ENV)
    if not directory or not os.path.isdir(directory):
        return
    target = Path(directory) / f"{os.getpid()}.json"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    with os.fdopen(fd, "w") as handle:
        json.dump(sources, handle)
    os.replace(tmp, target)


# --- engine side -------------------------------------------------------------------------------


class SideChannel:
    """A private directory the launch's schedulers write their sources into.

    Needed before 0.5.22: the DP controller runs no plugins there and rebuilds its ready
    message from scratch, dropping ``kv_event_sources``.
    """

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix=f"sglang-overlay-kvsrc-{os.getpid()}-")
        self._previous = os.environ.get(SOURCES_DIR_ENV)
        os.environ[SOURCES_DIR_ENV] = self.path

    def unexport(self) -> None:
        """Children are spawned: keep the variable out of anything started later."""
        if self._previous is None:
            os.environ.pop(SOURCES_DIR_ENV, None)
        else:
            os.environ[SOURCES_DIR_ENV] = self._previous

    def read(self) -> list[dict]:
        sources: list[dict] = []
        for entry in sorted(Path(self.path).glob("*.json")):
            sources.extend(json.loads(entry.read_text()))
        return sources

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def merged_sources(infos: Iterable[Mapping], extra: Iterable[Mapping] = ()) -> list[dict]:
    """Every local scheduler's sources, aggregated and checked by the core."""
    collected: list[Mapping] = []
    for info in infos:
        collected.extend(info.get("kv_event_sources") or [])
    collected.extend(extra)
    return aggregate_sources(collected)


def server_args_dict(server_args: Any) -> dict:
    resolved = getattr(server_args, "resolved_dict", None)
    if callable(resolved):
        return dict(resolved())
    import dataclasses

    return dataclasses.asdict(server_args)


def kv_events_descriptor(server_args: Any) -> Any:
    try:
        from sglang.srt.runtime_context import describe_kv_events_publisher
    except ImportError:
        return None
    return describe_kv_events_publisher(server_args)


def node_server_info(server_args: Any, scheduler_info: Mapping[str, Any]) -> dict:
    """The core's server-info object for this node, from SGLang's live objects."""
    return metadata.build_server_info(
        server_args_dict(server_args),
        scheduler_info,
        launch_command=getattr(server_args, "launch_command", None),
        kv_events=kv_events_descriptor(server_args),
        legacy_dp_size=metadata.legacy_dp_size_enabled(),
    )


def rebuild_server_info(upstream: Mapping[str, Any]) -> dict:
    """Run an upstream server-info body through the core builder, keeping its extras."""
    return metadata.build_server_info(
        upstream,
        {},
        launch_command=upstream.get("launch_command"),
        kv_events=upstream.get("kv_events"),
        kv_event_sources=upstream.get("kv_event_sources") or [],
        legacy_dp_size=metadata.legacy_dp_size_enabled(),
    )


def start_node_follower(
    server_args: Any, scheduler_info: Mapping[str, Any], scheduler_pids: Iterable[int]
) -> FollowerMetadataServer:
    """Start this follower node's metadata server on ``--host``/``--grpc-port``."""
    cfg = serving()
    info = node_server_info(server_args, scheduler_info)
    server = start_follower_server(
        str(cfg.host), int(cfg.grpc_port), metadata.render_server_info(info), scheduler_pids
    )
    _sidecar.attach_follower_sidecar(server, info.get("kv_event_sources") or [])
    return server


def reap(procs: Iterable[Any]) -> None:
    """Kill a launch's scheduler (or DP-controller) process trees after a failed start."""
    from sglang.srt.utils import kill_process_tree

    for proc in procs or []:
        pid = getattr(proc, "pid", proc)
        with contextlib.suppress(Exception):
            kill_process_tree(pid, wait_timeout=60)
