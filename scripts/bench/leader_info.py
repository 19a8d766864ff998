"""Row 7: the leader's GetServerInfo reply on 0.5.22+, rebuilt per call vs cached, in one
process of the SGLang environment given (``python -m bench.leader_reply``)."""

from __future__ import annotations

import subprocess
from typing import Any

from dev_paths import HARNESS, child_environ
from sglang_sidecar_overlay.entry_point import PLUGIN_NAME, SGLANG_PLUGINS_ENV

from bench.common import (
    SCRIPTS,
    SglangEnv,
    installed_package_site,
    last_error_line,
    last_json_line,
    median,
    ratio,
)


def measure(env: SglangEnv | None, calls: int) -> dict[str, Any]:
    if env is None:
        return {"error": "no Python with SGLang"}
    with installed_package_site() as site:
        # The harness' tiny model and its in-process leader handle come from test-registered/.
        environ = child_environ(site, SCRIPTS, HARNESS, inherit=False)
        proc = subprocess.run(
            [env.python, "-m", "bench.leader_reply", "--calls", str(calls)],
            capture_output=True,
            text=True,
            env={**environ, SGLANG_PLUGINS_ENV: PLUGIN_NAME},
        )
    if proc.returncode != 0:
        return {"error": last_error_line(proc.stderr)}
    return last_json_line(proc.stdout)


def render(results: dict[str, Any]) -> list[str]:
    li = results.get("leader_info")
    if li is None:
        return []
    lines = ["", "## 7. Leader GetServerInfo per call (0.5.22+)", ""]
    if "error" in li:
        return [*lines, f"Not measured: {li['error']}."]
    rebuilt, cached = median(li["rebuilt"]), median(li["cached"])
    return [
        *lines,
        "SGLang's real `RuntimeHandle.get_server_info` on a leader's launch-time state (a "
        f"{li['bytes']}-byte reply, two KV sources), called back to back in one process: "
        "built on every call by the overlay's hook, its cached text dropped before each call "
        "(the path before the reply was cached) vs the overlay's cached text, five "
        "alternating rounds.",
        "",
        "| path | median µs/call | max µs/call |",
        "|---|---:|---:|",
        f"| rebuilt per call | {rebuilt * 1e6:.1f} | {max(li['rebuilt']) * 1e6:.1f} |",
        f"| cached text | {cached * 1e6:.2f} | {max(li['cached']) * 1e6:.2f} |",
        f"| rebuilt / cached | {ratio(rebuilt, cached)} | |",
    ]
