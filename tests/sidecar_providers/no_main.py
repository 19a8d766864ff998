"""Has no ``main``."""


def run(argv: list[str]) -> None:
    pass
