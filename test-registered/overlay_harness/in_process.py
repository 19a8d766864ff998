"""An in-process leader for tests that launch nothing: real server args, the plugin loaded
through SGLang's own ``HookRegistry``, the leader's launch begun and the hooks it would
install."""

from __future__ import annotations

import importlib
import json
from typing import Any

from overlay_harness.group import TINY_MODEL

# Two attention-DP ranks' sources, as the leader's ready info carries them (out of order).
SOURCES = [
    {"dp_rank": 1, "endpoint": "tcp://127.0.0.1:45558", "topic": "", "block_size": 1},
    {"dp_rank": 0, "endpoint": "tcp://127.0.0.1:45557", "topic": "", "block_size": 1},
]


def leader_with_launch_hooks(groups: list[str]) -> Any:
    """Resolved server args of an attention-DP leader of the harness' tiny model,
    after loading the plugin and installing the launch-time hook ``groups``."""
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.server_args import prepare_server_args
    from sglang_sidecar_overlay import plugin

    model = TINY_MODEL
    kv_events = json.dumps({"publisher": "zmq", "endpoint": "tcp://*:45557", "topic": ""})
    server_args = prepare_server_args(
        ["--model-path", str(model), "--skip-tokenizer-init", "--device", "cpu",
         "--tp", "2", "--dp", "2", "--enable-dp-attention", "--grpc-port", "45999",
         "--kv-events-config", kv_events]
    )  # fmt: skip
    server_args.resolve_once()
    plugin.load()
    HookRegistry.apply_hooks()
    begin_launch(server_args)
    install_launch_hooks(groups)
    return server_args


def install_launch_hooks(groups: list[str]) -> list[str]:
    """Install the installed adapter's launch-time hook ``groups`` without a launch of the
    schedulers, as the launch hook would (``_launch.install_launch_hooks``)."""
    from sglang_sidecar_overlay import plugin
    from sglang_sidecar_overlay.adapters import _launch

    adapter = importlib.import_module(plugin.installed_adapter() or "")
    return _launch.install_launch_hooks(adapter.ADAPTER, groups)


def begin_launch(server_args: Any) -> None:
    """Begin a leader's launch of ``server_args`` in this process, as the launch hook does
    when SGLang launches the schedulers (its incarnation, switch and sidecar options): the
    explicit call an engine built outside SGLang's launch path needs before its hooks run."""
    from sglang_sidecar_overlay.adapters import _launch

    _launch.begin_node_launch(server_args)


def leader_runtime_handle(server_args: Any, sources: list, media_tokens: bool = True) -> Any:
    """SGLang's real ``RuntimeHandle`` (what its Rust gRPC server calls for ``GetServerInfo``)
    holding a leader's launch-time state: ``server_args`` and ready info carrying ``sources``.

    Made without ``__init__``, which would start the tokenizer manager's event loop: a
    stand-in tokenizer manager carries the real server args (it needs a model to exist for
    real) and, with ``media_tokens``, a stand-in multimodal processor whose image token
    upstream reports in ``grpc_features`` (0.5.23+).
    """
    import types

    from sglang.srt.entrypoints.grpc_bridge import RuntimeHandle

    mm_processor = None
    if media_tokens:
        tokens = types.SimpleNamespace(image_token="<image>", video_token=None, audio_token=None)
        mm_processor = types.SimpleNamespace(mm_tokens=tokens)
    handle = RuntimeHandle.__new__(RuntimeHandle)
    handle.tokenizer_manager = types.SimpleNamespace(
        server_args=server_args, mm_processor=mm_processor
    )
    handle.server_args = server_args
    handle.scheduler_info = {"status": "ready", "kv_event_sources": list(sources)}
    return handle
