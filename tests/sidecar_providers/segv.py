"""Killed by SIGSEGV as soon as it starts."""

import os
import signal

from sidecar_providers._report import no_core_dumps, write_report


def main(argv: list[str]) -> None:
    no_core_dumps()
    write_report(argv)
    os.kill(os.getpid(), signal.SIGSEGV)
