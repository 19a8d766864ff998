"""The node's server info from SGLang's objects, in the engine process: the builder's inputs.

SGLang's resolved server args, ready info and KV-events descriptor become plain data here and
go to the one builder (``contract.server_info.build_server_info``) with the node's publisher
bounds and, from the node's launch (an argument: the launch hook's, or for a hook SGLang calls
the process's ``_node_launch.current_launch``), its incarnation and the ``dp_size`` switch
decided when the launch began. Upstream's own replies are turned into
the builder's by the functions below: an HTTP ``/server_info`` body is passed through the
builder, and the 0.5.22+ leader's gRPC reply keeps only what upstream adds after its builder.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sglang_sidecar_overlay.adapters import _sglang
from sglang_sidecar_overlay.contract.redaction import redact
from sglang_sidecar_overlay.contract.server_info import (
    build_server_info,
    checked_sources,
    render_server_info,
    to_jsonable,
)

if TYPE_CHECKING:
    from sglang_sidecar_overlay.adapters._node_launch import NodeLaunch


def with_publisher_bounds(
    sources: Iterable[Mapping[str, Any]], bounds: Mapping[str, int]
) -> list[dict[str, Any]]:
    """``sources`` with the node's publisher bounds added where a source did not report them.

    0.5.22+ schedulers describe their sources without the bounds; every publisher of a
    node is built from the one ``--kv-events-config``, so its effective values are the
    config's (``_sglang.kv_publisher_bounds``).
    """
    return [{**bounds, **source} for source in sources]


def collected_sources(
    infos: Iterable[Mapping[str, Any]], extra: Iterable[Mapping[str, Any]] = ()
) -> list[Mapping[str, Any]]:
    """Every local scheduler's sources as reported; the builder aggregates and checks them."""
    collected: list[Mapping[str, Any]] = []
    for info in infos:
        collected.extend(info.get("kv_event_sources") or [])
    collected.extend(extra)
    return collected


def node_sources(server_args: Any, scheduler_info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The node's ready-time sources with the publisher bounds of its ``--kv-events-config``."""
    return with_publisher_bounds(
        scheduler_info.get("kv_event_sources") or [],
        _sglang.kv_publisher_bounds(getattr(server_args, "kv_events_config", None)),
    )


def node_server_info(
    launch: NodeLaunch, server_args: Any, scheduler_info: Mapping[str, Any]
) -> dict[str, Any]:
    """The core's server-info object for this node, from SGLang's live objects and the
    node's ``launch`` (its incarnation and ``dp_size`` switch)."""
    return build_server_info(
        _sglang.server_args_dict(server_args),
        scheduler_info,
        incarnation=launch.incarnation,
        launch_command=getattr(server_args, "launch_command", None),
        kv_events=_sglang.kv_events_descriptor(server_args),
        kv_event_sources=node_sources(server_args, scheduler_info),
        legacy_dp_size=launch.legacy_dp_size,
    )


def check_node_sources(server_args: Any, scheduler_info: Mapping[str, Any]) -> None:
    """Raise what the node's first reply would raise for its sources (a conflict, a rank
    outside the rank space), without building the reply."""
    sources = node_sources(server_args, scheduler_info)
    checked_sources(_sglang.server_args_dict(server_args), sources)


def leader_grpc_reply(
    launch: NodeLaunch, upstream_reply: str, server_args: Any, scheduler_info: Mapping[str, Any]
) -> str:
    """The 0.5.22+ leader's ``json_info``: upstream's ``GetServerInfo`` text with the core's
    object in place of upstream's builder's.

    The core's object gets SGLang's watermark redaction, as upstream's reply applies it over
    its builder; the keys upstream adds after its builder (0.5.23: ``grpc_features``) are
    kept, redacted like the rest.
    """
    core = _sglang.redact_watermark_secrets(node_server_info(launch, server_args, scheduler_info))
    upstream = json.loads(upstream_reply)
    extras = {key: value for key, value in upstream.items() if key not in core}
    return render_server_info({**core, **redact(to_jsonable(extras))})


def rebuild_server_info(
    launch: NodeLaunch,
    upstream: Mapping[str, Any],
    publisher_bounds: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Run an upstream server-info body of ``launch``'s node through the core builder, keeping
    its extras (the whole body redacted); ``publisher_bounds`` fill in what its sources do not
    report."""
    sources = upstream.get("kv_event_sources") or []
    if publisher_bounds:
        sources = with_publisher_bounds(sources, publisher_bounds)
    return build_server_info(
        upstream,
        {},
        incarnation=launch.incarnation,
        launch_command=upstream.get("launch_command"),
        kv_events=upstream.get("kv_events"),
        kv_event_sources=sources,
        legacy_dp_size=launch.legacy_dp_size,
    )


def rebuild_with_node_bounds(launch: NodeLaunch, upstream: Mapping[str, Any]) -> dict[str, Any]:
    """A 0.5.22+ body through the core builder, its sources given the node's publisher bounds.

    Upstream's schedulers describe their sources without the bounds; the body carries the
    resolved ``kv_events_config`` every publisher of the node was built from.
    """
    bounds = _sglang.kv_publisher_bounds(upstream.get("kv_events_config"))
    return rebuild_server_info(launch, upstream, bounds)
