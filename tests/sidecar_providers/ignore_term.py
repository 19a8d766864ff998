"""Ignores SIGTERM and never exits on its own."""

import signal

from sidecar_providers._report import sleep_forever, write_report


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    write_report(argv)
    sleep_forever()
