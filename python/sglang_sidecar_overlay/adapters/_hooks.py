"""Which hooks each SGLang process registers, and when: only what its role needs.

SGLang's ``HookRegistry`` pays for every hooked target: after patching it, ``_propagate_patch``
walks every loaded module to rebind ``from … import`` copies (about 20 ms per target in an
engine process holding ~6,000 modules, on every supported release; methods of classes are
walked too, and the registry offers no way to skip the walk). That walk is nearly all of the
plugin's cost, so the adapters hook as few targets per process as its role needs, and import
only what a hook needs when it runs. Where a method and a module-level function would do,
they hook the method: the upstream series' patch 0006 skips the walk for targets owned by a
class (no ``from … import`` copy of a method exists), so a launch that hooks only methods
walks nothing there.

- **Engine process**, at ``load_plugins()``: one hook, on
  ``Engine._launch_scheduler_processes``. When a launch starts, SGLang has published the
  serving config, so that hook knows the node's role (leader or follower, ``--sidecar`` or
  not, native gRPC or not) and installs this launch's hook groups through
  :func:`install_groups` (``HookRegistry.register`` + ``apply_hooks()``, which skips
  targets already patched). That is before anything they patch is called or bound: the
  follower branch, the tokenizer manager and its SIGTERM handler, and the HTTP lifespan all
  run after the scheduler launch.
- **Processes the launch spawns** (schedulers, the DP controller): they inherit the
  environment at spawn and register the groups their launch exported to them. A process
  that did not come from such a launch (no variable at all) registers every child group, as
  before.

What a launch hands the processes it spawns is one environment variable,
:data:`CHILD_LAUNCH_ENV`: a JSON object with the hook groups they register (``hooks``) and,
before 0.5.22, the side channel their sources go back through (``sources_dir``,
``_side_channel``). It holds them only while the launch spawns; what the engine spawns later
(the detokenizer, tokenizer workers) gets an empty value and registers nothing.

Which groups a launch needs is ``_plan.launch_plan``'s rule, the same for every release.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from sglang_sidecar_overlay.entry_point import DIST_NAME, PLUGIN_NAME

CHILD_LAUNCH_ENV = "SGLANG_SIDECAR_OVERLAY_CHILD_LAUNCH"


# A NamedTuple, not a dataclass: every process that loads the plugin defines it, and a
# dataclass costs about 1 ms more to define.
class Hook(NamedTuple):
    """One ``HookRegistry`` registration: target path, hook function, ``HookType`` name."""

    target: str
    fn: Callable[..., Any]
    kind: str


def register(registry: Any, hook_type: Any, hooks: Iterable[Hook], **kwargs: Any) -> None:
    for hook in hooks:
        registry.register(hook.target, hook.fn, getattr(hook_type, hook.kind), **kwargs)


def child_groups(all_groups: Iterable[str]) -> list[str]:
    """The child hook groups this (non-engine) process needs, from its launch's export."""
    exported = from_parent_launch()
    if exported is None:
        return list(all_groups)
    return [str(name) for name in exported.get("hooks") or []]


def install_groups(
    installed: set[str],
    lock: threading.Lock,
    groups: Mapping[str, Sequence[Hook]],
    names: Iterable[str],
) -> list[str]:
    """Register the named groups not in ``installed`` yet and apply them; returns those added.

    ``installed`` and ``lock`` are the process's (``_node_launch.PROCESS``): each group is
    installed once per process.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, HookType

    # Outside load_plugins() SGLang cannot tell whose hooks these are: say it (the names
    # its registry logs).
    source = HookSource(plugin_name=PLUGIN_NAME, dist_name=DIST_NAME)
    with lock:
        added = [name for name in names if name not in installed]
        for name in added:
            register(HookRegistry, HookType, groups[name], source=source)
            installed.add(name)
        if added:
            HookRegistry.apply_hooks()
    return added


def from_parent_launch() -> dict[str, Any] | None:
    """What the launch that spawned this process exported to it; None when no launch did."""
    raw = os.environ.get(CHILD_LAUNCH_ENV)
    if raw is None:
        return None
    exported = json.loads(raw) if raw else {}
    return exported if isinstance(exported, dict) else {}


@contextlib.contextmanager
def exported_to_children(hooks: Iterable[str], sources_dir: str | None = None) -> Iterator[None]:
    """Hand the processes spawned inside the block their hook groups (and side channel)."""
    os.environ[CHILD_LAUNCH_ENV] = json.dumps({"hooks": list(hooks), "sources_dir": sources_dir})
    try:
        yield
    finally:
        os.environ[CHILD_LAUNCH_ENV] = ""
