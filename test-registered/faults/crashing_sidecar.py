"""A ``--sidecar`` provider that crashes at once, every time: exit code 3."""

from __future__ import annotations

CRASH_EXIT_CODE = 3


def main(argv: list[str]) -> int:
    del argv
    return CRASH_EXIT_CODE
