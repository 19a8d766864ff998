"""The exit codes of the operator commands (the operator guide lists them); constants only."""

EXIT_OK = 0
# Something is wrong: ``status`` inactive, a contract error (or a warning under ``--strict``),
# a failed selftest check.
EXIT_PROBLEM = 1
# A bad command line (argparse's own code).
EXIT_USAGE = 2
# ``probe`` could not talk to the node (with ``--group``: to any node).
EXIT_UNREACHABLE = 3
# Ctrl-C: 128 + SIGINT, as a shell reports it.
EXIT_INTERRUPTED = 130
