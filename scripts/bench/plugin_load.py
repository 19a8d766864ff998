"""Program run in an SGLang environment: what ``load_plugins()`` costs, and what the overlay's
launch hook adds once a leader's launch starts.

    python -m bench.plugin_load [--bare]

Prints one JSON line: ``load_plugins`` (s), ``leader_launch`` (s, None without the overlay),
``overlay_modules`` (the overlay's modules loaded), ``targets`` (hooked targets at
``load_plugins()``, then added by the launch), ``walk`` (s: SGLang's walk over every loaded
module after patching one target), ``walks`` and ``registry`` (how many walks the registry
ran during both steps, and the seconds they took: the registry's share of the plugin's cost;
the rest is the overlay's own). Imports nothing of the overlay itself before
``load_plugins()``, so "was the plugin loaded" is read from ``sys.modules``.

Two SGLang internals are read, because no public API says this: ``HookRegistry._patched`` (the
targets patched so far) and ``hook_registry._propagate_patch`` (the walk).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time
from typing import Any

# What an engine process has imported before it runs load_plugins(): the plugin hooks these
# modules, so importing them is SGLang's launch cost, not the plugin's. ``--bare`` (the smoke
# pass) skips them: the row still runs, in a fraction of the time.
ENGINE_MODULES = (
    "sglang.srt.entrypoints.engine",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.entrypoints.grpc_bridge",
    "sglang.srt.entrypoints.sidecar",
    "sglang.srt.managers.scheduler",
    "sglang.srt.disaggregation.kv_events",
    "sglang.srt.utils.common",
)


def leader_launch() -> float:
    """Seconds the overlay's launch hook adds on a leader (native gRPC, no ``--sidecar``): the
    launch's incarnation begun, its hooks applied, the HTTP route rebound."""
    started = time.perf_counter()
    from sglang_sidecar_overlay import plugin
    from sglang_sidecar_overlay.adapters import _launch

    adapter = importlib.import_module(plugin.installed_adapter() or "")
    _launch.begin_node_launch()
    _launch.install_launch_hooks(adapter.ADAPTER, ["leader_grpc"])
    return time.perf_counter() - started


def time_walks(hook_registry: Any) -> list[float]:
    """Every call of the registry's walk from now on, timed: a list of their durations."""
    walk = hook_registry._propagate_patch
    durations: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return walk(*args, **kwargs)
        finally:
            durations.append(time.perf_counter() - started)

    hook_registry._propagate_patch = timed
    return durations


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bare", action="store_true", help="skip the engine pre-imports")
    args = parser.parse_args(argv)
    for name in () if args.bare else ENGINE_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    import sglang.srt.plugins as plugins
    from sglang.srt.plugins import hook_registry

    walks = time_walks(hook_registry)
    t1 = time.perf_counter()
    plugins.load_plugins()
    t2 = time.perf_counter()
    overlay_modules = sorted(m for m in sys.modules if m.startswith("sglang_sidecar_overlay"))
    targets = [len(hook_registry.HookRegistry._patched), None]
    launch = None
    if overlay_modules:
        launch = leader_launch()
        targets[1] = len(hook_registry.HookRegistry._patched) - targets[0]
    counted = list(walks)
    # The walk once, for an object no module holds: what each hooked target costs on top of
    # wrapping it.
    t3 = time.perf_counter()
    hook_registry._propagate_patch(object(), object(), None)
    walk = time.perf_counter() - t3
    print(
        json.dumps(
            {
                "load_plugins": t2 - t1,
                "leader_launch": launch,
                "overlay_modules": overlay_modules,
                "targets": targets,
                "walk": walk,
                "walks": len(counted),
                "registry": sum(counted),
            }
        )
    )


if __name__ == "__main__":
    main()
