"""Serves until SIGTERM, then exits 0 (a cooperative sidecar)."""

import signal
import sys

from sidecar_providers._report import sleep_forever, write_report


def main(argv: list[str]) -> None:
    def on_term(signum: int, frame: object) -> None:
        write_report(argv, ".term")
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    write_report(argv)
    sleep_forever()
