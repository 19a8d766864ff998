"""SGLang plugin entry point: ``sglang.srt.plugins`` → ``sidecar_overlay = plugin:load``.

SGLang's ``load_plugins()`` calls ``load`` once per process that runs plugins: the launcher
or engine process, every scheduler process and, from 0.5.22, the DP controller. ``load``
reads the installed SGLang version (without importing SGLang), picks the adapter for that
API generation and registers the hooks this process's role needs with SGLang's
``HookRegistry``; ``load_plugins()`` applies them right after. Each hooked target costs a
walk over every loaded module, so the engine process registers one hook here and the rest
when a launch tells it the node's role (``adapters/_hooks.py``). An unsupported version
gets one warning naming the supported range and nothing is installed. Calling ``load``
again in the same process does nothing: its guard is ``PROCESS.loaded``, in the one object
that holds the overlay's state in a process (``adapters/_node_launch.py``).
``SGLANG_PLUGINS`` allow-listing is SGLang's own: a list without ``sidecar_overlay`` means
``load`` is never called.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing

from sglang_sidecar_overlay import releases
from sglang_sidecar_overlay.adapters._node_launch import PROCESS

logger = logging.getLogger(__name__)

__all__ = ["installed_adapter", "load"]


def installed_adapter() -> str | None:
    """The adapter module whose hooks this process registered, or None."""
    return PROCESS.adapter


def _is_main_process() -> bool:
    # Engine-side hooks belong where the engine runs; its children (schedulers, DP controller,
    # detokenizer) register only what their launch exported to them.
    return multiprocessing.parent_process() is None


def load() -> None:
    """Register the hooks of the adapter matching the installed SGLang. Idempotent."""
    with PROCESS.lock:
        if PROCESS.loaded:
            return
        PROCESS.loaded = True
        version = releases.installed_sglang_version()
        adapter_name = releases.adapter_for(version) if version else None
        if adapter_name is None:
            logger.warning(
                "sglang-sidecar-overlay supports SGLang %s; found %s, so no hooks are installed",
                releases.SUPPORTED_RANGE,
                version or "no SGLang",
            )
            return
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        adapter = importlib.import_module(adapter_name)
        adapter.register(HookRegistry, HookType, main_process=_is_main_process())
        PROCESS.adapter = adapter_name
        logger.info("sglang-sidecar-overlay: SGLang %s hooks from %s", version, adapter_name)
