#!/usr/bin/env python3
"""The benchmark command, ``python scripts/benchmark.py [--quick] [--no-write] ...``: the
``bench`` package beside this file holds its rows (see its docstring)."""

from bench.cli import main

if __name__ == "__main__":
    main()
