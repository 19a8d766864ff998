"""Which side of the patch series' equivalence run the tests are on, and what may differ.

``scripts/sglang_envs.py test --patched`` runs the scenario files against the rebuilt sglang
wheel with the plugin not loaded and sets ``SIDE_ENV``; the same files run against stock
SGLang with the plugin. The allowed differences are ``patches/DIFFERENCES.md``'s, by number
there; a test reads them here and asserts the documented behaviour of each side, never less.
"""

from __future__ import annotations

import os

from sglang_sidecar_overlay.contract.server_info import LEGACY_DP_SIZE_ENV

SIDE_ENV = "SGLANG_OVERLAY_TEST_SIDE"
REBUILT_WHEEL = "rebuilt-wheel"

# patches/DIFFERENCES.md #1: upstream's follower server (Rust, not in the wheel) has no
# grpc.health.v1; a Check on its port is UNIMPLEMENTED.
FOLLOWER_HEALTH = 1
# patches/DIFFERENCES.md #2: the plugin's own log lines are absent (its follower server's
# "... is SERVING" / "stopped", the launch's "node launch incarnation ..."); the series logs
# through SGLang's loggers, its supervisor's lines worded upstream's way ("Sidecar module X ...").
PLUGIN_LOG_LINES = 2

# patches/DIFFERENCES.md #3: the series names the dp_size switch differently; a test that sets
# it sets both names, so no assertion differs.
UPSTREAM_LEGACY_DP_SIZE_ENV = "SGLANG_SERVER_INFO_LEGACY_DP_SIZE"
DP_SIZE_SWITCH_NAMES = (LEGACY_DP_SIZE_ENV, UPSTREAM_LEGACY_DP_SIZE_ENV)

# patches/DIFFERENCES.md #5: a prefill launched without the plugin runs the engine's own
# prefill sender, which the series fixes (patch 0005): odd rooms succeed, no failure to reproduce.
ENGINE_BOOTSTRAP_RANK = 5

# patches/DIFFERENCES.md #6: the series has the dp_size switch but not the plugin's default of
# turning it on for Dynamo's released sidecar; a group running that sidecar sets it there.
DYNAMO_SWITCH_DEFAULT = 6

# patches/DIFFERENCES.md #8: the series hands a sidecar its endpoint in SGLANG_GRPC_ENDPOINT
# only, not also in Dynamo's DYN_SIDECAR_GRPC_ENDPOINT; a group running Dynamo's released
# sidecar passes --grpc-endpoint there.
DYNAMO_ENDPOINT_ENV = 8

# patches/DIFFERENCES.md #10: the series detects conflicting sources where upstream aggregates
# them, in the follower's DP controller, whose exception takes the node down through SGLang's
# SIGQUIT path (the node is SIGKILLed, the error is in its log, not a launch error).
CONFLICT_IN_DP_CONTROLLER = 10

ALLOWED = frozenset(
    {
        FOLLOWER_HEALTH,
        PLUGIN_LOG_LINES,
        ENGINE_BOOTSTRAP_RANK,
        DYNAMO_SWITCH_DEFAULT,
        DYNAMO_ENDPOINT_ENV,
        CONFLICT_IN_DP_CONTROLLER,
    }
)


def dp_size_switch(enabled: bool) -> dict[str, str]:
    """The ``dp_size`` switch set under the plugin's and the series' names (#3)."""
    return dict.fromkeys(DP_SIZE_SWITCH_NAMES, "1" if enabled else "0")


def sidecar_exit_line(module: str, how: str) -> str:
    """The supervisor's log line for ``module`` having ``how`` (``exited with code 1``)."""
    if differs(PLUGIN_LOG_LINES):
        return f"Sidecar module {module} {how}"
    return f"sidecar {module!r} {how}"


def on_rebuilt_wheel() -> bool:
    return os.environ.get(SIDE_ENV) == REBUILT_WHEEL


def differs(number: int) -> bool:
    """True when difference ``number`` applies to this run (it must be an allowed one)."""
    if number not in ALLOWED:
        raise ValueError(f"difference {number} is not in patches/DIFFERENCES.md's list")
    return on_rebuilt_wheel()
