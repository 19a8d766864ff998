"""Provider modules for the ``--sidecar`` supervisor tests, one behaviour each.

Each ``main(argv)`` takes ``--report PATH`` (anywhere in argv) and writes a JSON report there
atomically, so tests can wait for it. Timestamps are ``time.monotonic()``, which is system-wide on
Linux and so comparable with the test process.
"""
