"""Puts this directory on sys.path (pytest's rootdir conftest rule), so the tests and the
processes SGLang spawns for them can import ``overlay_harness``."""
