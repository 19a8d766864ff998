"""Run one harness function inside a node's namespace: ``python -m overlay_harness.inside
MODULE FUNCTION ARGS_JSON``, started through ``Host.command`` (``ip netns exec``).

A node of a multi-node group is its own host (``overlay_harness.netns``), so the test process
asks it through this runner: the function's JSON result is one line on stdout; a generator's
items are one line each, as they come (a Watch stream). An exception is one
``{"raised": ...}`` line and exit 1.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys


def _emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    module, function, args = argv
    target = getattr(importlib.import_module(module), function)
    try:
        result = target(*json.loads(args))
        if inspect.isgenerator(result):
            for item in result:
                _emit({"item": item})
            return 0
        _emit({"result": result})
    except Exception as exc:  # reported to the test, which raises it there
        _emit({"raised": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
