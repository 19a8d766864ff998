"""The one report type of the operator commands, and the text every report is printed with.

Every command (``status``, ``probe``, ``probe --group``, ``probe --watch``, ``selftest``)
returns a :class:`Report`. The CLI prints ``to_json()`` under ``--json`` and ``render(out)``
otherwise, then exits with ``exit_code()``, which follows from the verdict alone: 0 ``ok``,
1 not ok, 3 when nothing could be asked at all (``unreachable``). A report decides what it
says; how a line looks (check marks, aligned labels) is decided here, once.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from sglang_sidecar_overlay.tools.exit_codes import EXIT_OK, EXIT_PROBLEM, EXIT_UNREACHABLE

__all__ = ["Line", "Report", "marks_for", "print_json", "print_lines", "verdict_line"]

# One human line: (level, label, message); level is ok, info, warning or error.
Line = tuple[str, str, str]

_MARKS = {"ok": "✓", "info": "·", "warning": "!", "error": "✗"}
_ASCII_MARKS = {"ok": "ok", "info": "..", "warning": "WARN", "error": "FAIL"}
_LABEL_WIDTH_CAP = 40


class Report(abc.ABC):
    """What one operator command found: its verdict, exit code, JSON object and text."""

    @property
    @abc.abstractmethod
    def ok(self) -> bool:
        """Nothing wrong."""

    @property
    def unreachable(self) -> bool:
        """Nothing could be asked at all (a probe whose node, or every node, did not answer)."""
        return False

    def exit_code(self) -> int:
        """0 all good, 1 something is wrong, 3 nothing could be asked (the operator guide)."""
        if self.unreachable:
            return EXIT_UNREACHABLE
        return EXIT_OK if self.ok else EXIT_PROBLEM

    @abc.abstractmethod
    def to_json(self) -> dict[str, Any]:
        """The stable ``--json`` object (documented in the operator guide)."""

    @abc.abstractmethod
    def render(self, out: TextIO) -> None:
        """The human output on ``out``; a report that could not be made says so on stderr."""


def marks_for(out: TextIO) -> Mapping[str, str]:
    """Check marks, or ASCII words when ``out``'s encoding cannot show them."""
    encoding = getattr(out, "encoding", None) or "ascii"
    try:
        "".join(_MARKS.values()).encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return _ASCII_MARKS
    return _MARKS


def print_lines(lines: Sequence[Line], out: TextIO, indent: str = "  ") -> None:
    """One aligned line each: mark, label (padded, up to a cap), message."""
    marks = marks_for(out)
    width = min(max((len(label) for _, label, _ in lines), default=0), _LABEL_WIDTH_CAP)
    mark_width = max(len(mark) for mark in marks.values())
    for level, label, message in lines:
        print(f"{indent}{marks[level]:<{mark_width}} {label:<{width}}  {message}", file=out)


def verdict_line(ok: bool, errors: int, warnings: int) -> str:
    """``PASS (0 errors, 1 warning)`` or ``FAIL (...)``."""
    word = "PASS" if ok else "FAIL"
    return (
        f"{word} ({errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)})"
    )


def print_json(obj: Any, out: TextIO) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False), file=out)
