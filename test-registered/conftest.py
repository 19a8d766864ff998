"""Puts this directory on sys.path (pytest's rootdir conftest rule), so the tests and the
processes SGLang spawns for them can import ``overlay_harness``."""

import os

# CustomTestCase re-runs a failed test SGLANG_TEST_MAX_RETRY times; each run here launches
# whole nodes, so a failure should be reported once, not retried into the time budget.
os.environ.setdefault("SGLANG_TEST_MAX_RETRY", "0")
