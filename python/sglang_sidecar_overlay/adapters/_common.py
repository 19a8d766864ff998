"""What every adapter does with SGLang's objects: collect plain data, call the core.

Imported only by an adapter, so only where SGLang is installed. Runs in two kinds of
process: schedulers (read back what their publisher bound, describe it as a source) and the
engine (hand a node's collected sources and server args to the one builder; start the
follower metadata server). SGLang's runtime state is read through ``_sglang``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sglang_sidecar_overlay.adapters import _sglang
from sglang_sidecar_overlay.contract.endpoints import is_bind_endpoint
from sglang_sidecar_overlay.contract.incarnation import begin_launch, launch_incarnation
from sglang_sidecar_overlay.contract.redaction import redact
from sglang_sidecar_overlay.contract.server_info import (
    build_server_info,
    legacy_dp_size_enabled,
    render_server_info,
    to_jsonable,
)
from sglang_sidecar_overlay.contract.sources import describe_source
from sglang_sidecar_overlay.sidecar import proctree

if TYPE_CHECKING:
    from sglang_sidecar_overlay.server.follower import FollowerMetadataServer

logger = logging.getLogger("sglang_sidecar_overlay.adapters")

HTTP_SERVER_MODULE = "sglang.srt.entrypoints.http_server"
SERVER_INFO_PATH = "/server_info"

# Attributes the publisher hook sets on a ZmqEventPublisher (a plain class, not slotted).
PUB_ENDPOINT_ATTR = "_sidecar_overlay_pub_endpoint"
REPLAY_ENDPOINT_ATTR = "_sidecar_overlay_replay_endpoint"


# --- publisher side (scheduler process) --------------------------------------------------------


def record_bound_endpoints(publisher: Any) -> None:
    """Read back what the publisher's sockets bound to, in the thread that created them."""
    import zmq

    pub = getattr(publisher, "_pub", None)
    endpoint = getattr(publisher, "_endpoint", "") or ""
    bound = None
    if pub is not None and is_bind_endpoint(endpoint):
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
    return int(scheduler.page_size) * _sglang.dcp_size()


# --- engine side -------------------------------------------------------------------------------


def begin_node_launch() -> None:
    """A new incarnation for this launch of the node; called before its schedulers start."""
    incarnation = begin_launch()
    logger.info("node launch incarnation %s", incarnation.id)


def collected_sources(infos: Iterable[Mapping], extra: Iterable[Mapping] = ()) -> list[dict]:
    """Every local scheduler's sources as reported; the builder aggregates and checks them."""
    collected: list[dict] = []
    for info in infos:
        collected.extend(info.get("kv_event_sources") or [])
    collected.extend(extra)
    return collected


def node_server_info(server_args: Any, scheduler_info: Mapping[str, Any]) -> dict:
    """The core's server-info object for this node, from SGLang's live objects."""
    return build_server_info(
        _sglang.server_args_dict(server_args),
        scheduler_info,
        incarnation=launch_incarnation(),
        launch_command=getattr(server_args, "launch_command", None),
        kv_events=_sglang.kv_events_descriptor(server_args),
        legacy_dp_size=legacy_dp_size_enabled(),
    )


def rebuild_server_info(upstream: Mapping[str, Any]) -> dict:
    """Run an upstream server-info body through the core builder, keeping its extras."""
    return build_server_info(
        upstream,
        {},
        incarnation=launch_incarnation(),
        launch_command=upstream.get("launch_command"),
        kv_events=upstream.get("kv_events"),
        kv_event_sources=upstream.get("kv_event_sources") or [],
        legacy_dp_size=legacy_dp_size_enabled(),
    )


def redacted_body(upstream: Mapping[str, Any]) -> dict:
    """An upstream body already built by the core, its extras (``internal_states``) redacted."""
    return redact(to_jsonable(upstream))


def rebind_loaded_server_info_route(transform: Callable[[Mapping[str, Any]], dict]) -> None:
    """Rebind ``/server_info`` when ``http_server.launch_server`` is launching (module loaded).

    Called as the launch starts: the app serves only after the launch.
    """
    http_server = sys.modules.get(HTTP_SERVER_MODULE)
    if http_server is not None:
        rebind_server_info_route(http_server, transform)


def rebind_server_info_route(
    http_server: Any, transform: Callable[[Mapping[str, Any]], dict]
) -> None:
    """Point ``/server_info`` (and the deprecated alias) at ``transform(upstream body)``.

    FastAPI bound the route function when ``http_server`` was imported, before any hook
    could run, so the route itself is replaced. Idempotent.
    """
    from fastapi.routing import APIRoute

    routes = http_server.app.router.routes
    for index, route in enumerate(routes):
        if not isinstance(route, APIRoute) or route.path != SERVER_INFO_PATH:
            continue
        if getattr(route.endpoint, "_sidecar_overlay", False):
            return
        server_info = _transformed_endpoint(route.endpoint, transform)
        routes[index] = APIRoute(
            route.path, server_info, methods=list(route.methods or ["GET"]), name=route.name
        )
        # The deprecated /get_server_info calls the module-level name.
        http_server.server_info = server_info
        return


def _transformed_endpoint(upstream: Any, transform: Callable[[Mapping[str, Any]], dict]) -> Any:
    async def server_info() -> dict:
        return transform(await upstream())

    server_info._sidecar_overlay = True
    server_info.__doc__ = upstream.__doc__
    return server_info


def start_node_follower(
    server_args: Any, scheduler_info: Mapping[str, Any], scheduler_pids: Iterable[int]
) -> FollowerMetadataServer:
    """Start this follower node's metadata server on ``--host``/``--grpc-port``."""
    # Imported here: only a follower's engine process serves its own metadata.
    from sglang_sidecar_overlay.server.follower import start_follower_server

    cfg = _sglang.serving()
    info = node_server_info(server_args, scheduler_info)
    server = start_follower_server(
        str(cfg.host), int(cfg.grpc_port), render_server_info(info), scheduler_pids
    )
    module, _ = _sglang.sidecar_config()
    if module is not None:
        # Imported only where a sidecar is configured: the supervisor is most of the code.
        from sglang_sidecar_overlay.adapters import _sidecar

        _sidecar.attach_follower_sidecar(server, info.get("kv_event_sources") or [])
    return server


def exit_description(exitcode: int) -> str:
    """``exit code 3`` or ``signal SIGKILL``, from a ``multiprocessing`` exit code."""
    if exitcode >= 0:
        return f"exit code {exitcode}"
    return f"signal {proctree.signal_name(-exitcode) or -exitcode}"


def failing_on_scheduler_crash(block: Callable[[], None], procs: Any) -> Callable[[], None]:
    """``block_until_scheduler_exits`` of a follower node that fails when a scheduler crashed.

    SGLang's follower branch joins its scheduler processes in order, logs each exit and
    returns, so ``launch_server`` returns and the node exits 0 even when a scheduler was
    killed, and it keeps waiting on the first one while a later one is already dead. This
    waits on all of them at once instead: the first non-zero exit (or signal) reaps the
    node's other schedulers and raises, naming the process and how it ended, so the node
    exits non-zero with the cause. When every one ends with exit code 0, upstream's join
    runs as before.
    """

    def block_then_check() -> None:
        crashed = _first_crash(list(procs or []))
        if crashed is None:
            block()
            crashed = next((p for p in procs or [] if p.exitcode not in (None, 0)), None)
        if crashed is None:
            return
        _sglang.reap(p for p in procs or [] if p.exitcode is None)
        message = (
            f"follower node {_sglang.node_rank()}: scheduler process {crashed.pid} "
            f"({exit_description(crashed.exitcode)}) ended while the node served; the node stops"
        )
        logger.error("%s", message)
        raise RuntimeError(message)

    return block_then_check


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
