"""Puts this directory on sys.path (pytest's rootdir conftest rule), so the tests and the
processes SGLang spawns for them can import ``overlay_harness``."""

import os

# CustomTestCase re-runs a failed test SGLANG_TEST_MAX_RETRY times; each run here launches
# whole nodes, so a failure is reported once, not retried into the time budget. Set, not
# defaulted: a value inherited from the caller's shell would let a flaky test pass on retry.
os.environ["SGLANG_TEST_MAX_RETRY"] = "0"
