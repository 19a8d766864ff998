"""Puts this directory on sys.path (pytest's rootdir conftest rule), so the tests and the
processes SGLang spawns for them can import ``overlay_harness``; and makes the tier independent
of the caller's environment."""

import os

import pytest
from overlay_harness import gate, ports

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Sessions run side by side meet the large-launch gate at different points of their runs
    (``overlay_harness.gate.staggered``) instead of queueing at it together."""
    share = ports.parse_share(os.environ.get(ports.PORT_SHARE_ENV))
    items[:] = gate.staggered(
        items,
        module_of=lambda item: item.module,
        large=lambda item: item.get_closest_marker(gate.LARGE_LAUNCH_MARK) is not None,
        share=share,
    )
