"""How the contract reads JSON values: as typed consumers (serde, Go) do, a bool is not an int.

Python's ``bool`` is a subclass of ``int``, so ``isinstance(True, int)`` holds; every rank,
width, size and count check of the package goes through :func:`is_int` instead.
"""

from __future__ import annotations

from typing import TypeGuard

__all__ = ["is_int"]


def is_int(value: object) -> TypeGuard[int]:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)
