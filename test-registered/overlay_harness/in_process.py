"""An in-process leader for tests that launch nothing: real server args, the plugin loaded
through SGLang's own ``HookRegistry``, and the hooks a leader's launch would install."""

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
    adapter = importlib.import_module(plugin.installed_adapter() or "")
    adapter.install_launch_hooks(groups)
    return server_args
