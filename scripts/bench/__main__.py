"""``python scripts/bench``: the benchmark command (see the package docstring)."""

import sys
from pathlib import Path

# Run as a directory, Python puts this package's own folder first on sys.path; the package
# and its sibling scripts are imported from their parent instead.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
