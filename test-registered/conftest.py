"""Puts this directory on sys.path (pytest's rootdir conftest rule), so the tests and the
processes SGLang spawns for them can import ``overlay_harness``; and makes the tier independent
of the caller's environment."""

import os

# Every node inherits this process's environment, and SGLang, the overlay and Dynamo read
# switches from it (SGLANG_RUST_SERVER, the dp_size switch, DYN_*): a value left in the caller's
# shell would change what the tests observe. Each launch sets the ones it means. Kept: the
# harness's and the scripts' own SGLANG_OVERLAY_* settings.
INHERITED_PREFIXES = ("SGLANG_", "DYN_")
KEPT_PREFIX = "SGLANG_OVERLAY_"

for _name in list(os.environ):
    if _name.startswith(INHERITED_PREFIXES) and not _name.startswith(KEPT_PREFIX):
        del os.environ[_name]

# CustomTestCase re-runs a failed test SGLANG_TEST_MAX_RETRY times; each run here launches
# whole nodes, so a failure is reported once, not retried into the time budget.
os.environ["SGLANG_TEST_MAX_RETRY"] = "0"
