"""SGLang accessors: every read of SGLang's runtime state the adapters need, in one place.

Imported only where SGLang is installed; SGLang modules are imported inside the functions,
because the plugin loads in every SGLang process and most of them never reach these paths.
Each function returns plain data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterable
from typing import Any


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


def dcp_size() -> int:
    from sglang.srt.runtime_context import get_parallel

    return int(getattr(get_parallel(), "dcp_size", None) or 1)


def sidecar_args_list(raw: Any) -> list[str]:
    """``--sidecar-args`` as a list: SGLang holds it as a JSON string or a list."""
    if isinstance(raw, str):
        raw = json.loads(raw)
    return [str(arg) for arg in raw or []]


def server_args_dict(server_args: Any) -> dict[str, Any]:
    resolved = getattr(server_args, "resolved_dict", None)
    if callable(resolved):
        return dict(resolved())

    return dataclasses.asdict(server_args)


def kv_events_descriptor(server_args: Any) -> Any:
    try:
        from sglang.srt.runtime_context import describe_kv_events_publisher
    except ImportError:
        return None
    return describe_kv_events_publisher(server_args)


def kv_publisher_bounds(raw: Any) -> dict[str, int]:
    """The bounds every ZMQ publisher of this node is built with, from ``--kv-events-config``
    (``raw``: the server arg's value, JSON text or a mapping).

    Parsed by SGLang's own ``KVEventsConfig``, whose fields ``EventPublisherFactory`` passes
    to each ``ZmqEventPublisher`` (unset ones at the config's defaults); mapped the way the
    publisher applies them. ``{}`` without a config or for another publisher kind.
    """
    if not raw:
        return {}
    from sglang.srt.disaggregation.kv_events import KVEventsConfig

    try:
        cfg = KVEventsConfig.from_cli(raw) if isinstance(raw, str) else KVEventsConfig(**raw)
    except (TypeError, ValueError):
        # SGLang refuses such a config itself before any publisher exists.
        return {}
    if cfg.publisher != "zmq":
        return {}
    return {
        "replay_buffer_steps": max(int(cfg.buffer_steps), 0),
        "hwm": max(int(cfg.hwm), 0),
        "max_queue_size": max(int(cfg.max_queue_size), 0),
    }


def redact_watermark_secrets(value: Any) -> Any:
    """SGLang's own watermark redaction, as its replies apply it over its builder's object."""
    from sglang.srt.sampling.watermarking.core import redact_watermark_secrets

    return redact_watermark_secrets(value)


def reap(procs: Iterable[Any]) -> None:
    """Kill a launch's scheduler (or DP-controller) process trees after a failed start."""
    from sglang.srt.utils import kill_process_tree

    for proc in procs or []:
        pid = getattr(proc, "pid", proc)
        with contextlib.suppress(Exception):
            kill_process_tree(pid, wait_timeout=60)
