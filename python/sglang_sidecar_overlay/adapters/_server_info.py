"""The node's server info from SGLang's objects, in the engine process: the builder's inputs.

SGLang's resolved server args, ready info and KV-events descriptor become plain data here and
go to the one builder (``contract.server_info.build_server_info``) with the launch's
incarnation, the node's publisher bounds and the legacy ``dp_size`` switch (on by default for
a ``--sidecar`` that checks ranks against ``dp_size``). Upstream's own replies are turned into
the builder's by the functions below: an HTTP ``/server_info`` body is passed through the
builder, and the 0.5.22+ leader's gRPC reply keeps only what upstream adds after its builder.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from sglang_sidecar_overlay.adapters import _sglang
from sglang_sidecar_overlay.adapters._publisher import with_publisher_bounds
from sglang_sidecar_overlay.contract.incarnation import launch_incarnation
from sglang_sidecar_overlay.contract.legacy_dp_size import consumer_version
from sglang_sidecar_overlay.contract.redaction import redact
from sglang_sidecar_overlay.contract.server_info import (
    LEGACY_DP_SIZE_ENV,
    build_server_info,
    legacy_dp_size_enabled,
    render_server_info,
    to_jsonable,
)

logger = logging.getLogger(__name__)


def collected_sources(
    infos: Iterable[Mapping[str, Any]], extra: Iterable[Mapping[str, Any]] = ()
) -> list[Mapping[str, Any]]:
    """Every local scheduler's sources as reported; the builder aggregates and checks them."""
    collected: list[Mapping[str, Any]] = []
    for info in infos:
        collected.extend(info.get("kv_event_sources") or [])
    collected.extend(extra)
    return collected


_legacy_decision_logged = False


def legacy_dp_size(server_args: Mapping[str, Any]) -> bool:
    """The ``dp_size`` switch for this node: as set, or on by default for a ``--sidecar``
    that checks ranks against the data-parallel widths (logged once per process)."""
    global _legacy_decision_logged
    sidecar = server_args.get("sidecar")
    enabled = legacy_dp_size_enabled(sidecar=sidecar)
    if not _legacy_decision_logged and (enabled or LEGACY_DP_SIZE_ENV in os.environ):
        _legacy_decision_logged = True
        logger.info("%s", legacy_dp_size_decision(enabled, sidecar))
    return enabled


def legacy_dp_size_decision(enabled: bool, sidecar: str | None) -> str:
    """One line: the switch's state, what it was based on, and the shape it serves."""
    if LEGACY_DP_SIZE_ENV in os.environ:
        basis = f"{LEGACY_DP_SIZE_ENV}={os.environ[LEGACY_DP_SIZE_ENV]!r} set by the operator"
    else:
        basis = f"{LEGACY_DP_SIZE_ENV} not set: on for --sidecar {sidecar}"
    consumer = consumer_version(sidecar)
    if consumer is not None:
        distribution, version = consumer
        basis += f" ({distribution} {version or 'not installed here'})"
    if not enabled:
        return f"{basis}: dp_size and attn_dp_size reported as SGLang resolved them"
    return (
        f"{basis}: dp_size reports the KV-publisher ranks and attn_dp_size 1, the shape "
        "Dynamo <= 1.6.1 (dp_rank < dp_size) and >= 1.7 (dp_rank < dp_size * attn_dp_size) "
        "both register exactly (set it to 0 to report SGLang's own widths)"
    )


def node_server_info(server_args: Any, scheduler_info: Mapping[str, Any]) -> dict[str, Any]:
    """The core's server-info object for this node, from SGLang's live objects."""
    args = _sglang.server_args_dict(server_args)
    return build_server_info(
        args,
        scheduler_info,
        incarnation=launch_incarnation(),
        launch_command=getattr(server_args, "launch_command", None),
        kv_events=_sglang.kv_events_descriptor(server_args),
        kv_event_sources=with_publisher_bounds(
            scheduler_info.get("kv_event_sources") or [],
            _sglang.kv_publisher_bounds(getattr(server_args, "kv_events_config", None)),
        ),
        legacy_dp_size=legacy_dp_size(args),
    )


def leader_grpc_reply(
    upstream_reply: str, server_args: Any, scheduler_info: Mapping[str, Any]
) -> str:
    """The 0.5.22+ leader's ``json_info``: upstream's ``GetServerInfo`` text with the core's
    object in place of upstream's builder's.

    The core's object gets SGLang's watermark redaction, as upstream's reply applies it over
    its builder; the keys upstream adds after its builder (0.5.23: ``grpc_features``) are
    kept, redacted like the rest.
    """
    core = _sglang.redact_watermark_secrets(node_server_info(server_args, scheduler_info))
    upstream = json.loads(upstream_reply)
    extras = {key: value for key, value in upstream.items() if key not in core}
    return render_server_info({**core, **redact(to_jsonable(extras))})


def log_leader_reply_built(text: str) -> None:
    """Once per launch: the leader's reply was built, and is cached text from now on."""
    logger.info(
        "leader GetServerInfo reply built (%d bytes), served as cached text for this launch",
        len(text),
    )


def rebuild_server_info(
    upstream: Mapping[str, Any], publisher_bounds: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Run an upstream server-info body through the core builder, keeping its extras (the
    whole body redacted); ``publisher_bounds`` fill in what its sources do not report."""
    sources = upstream.get("kv_event_sources") or []
    if publisher_bounds:
        sources = with_publisher_bounds(sources, publisher_bounds)
    return build_server_info(
        upstream,
        {},
        incarnation=launch_incarnation(),
        launch_command=upstream.get("launch_command"),
        kv_events=upstream.get("kv_events"),
        kv_event_sources=sources,
        legacy_dp_size=legacy_dp_size(upstream),
    )


def rebuild_with_node_bounds(upstream: Mapping[str, Any]) -> dict[str, Any]:
    """A 0.5.22+ body through the core builder, its sources given the node's publisher bounds.

    Upstream's schedulers describe their sources without the bounds; the body carries the
    resolved ``kv_events_config`` every publisher of the node was built from.
    """
    bounds = _sglang.kv_publisher_bounds(upstream.get("kv_events_config"))
    return rebuild_server_info(upstream, bounds)
