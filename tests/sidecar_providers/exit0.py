"""Returns from main at once: a clean exit the server did not ask for."""

from sidecar_providers._report import write_report


def main(argv: list[str]) -> None:
    write_report(argv)
