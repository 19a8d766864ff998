"""``python -m sglang_sidecar_overlay``: the same commands as the console script."""

import sys

from sglang_sidecar_overlay.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
