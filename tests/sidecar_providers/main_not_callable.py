"""Its ``main`` is not callable."""

main = 42
