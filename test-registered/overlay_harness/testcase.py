"""The test cases the tier's engine-launching classes start from."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay import releases

from overlay_harness import fault_rows, nodes, seed_checks

# A directory to copy each class's working directory into before it is removed (the logs of a
# run to read afterwards); unset, nothing is kept.
KEEP_LOGS_ENV = "SGLANG_OVERLAY_TEST_KEEP_LOGS"


class NodesTestCase(CustomTestCase):
    """One working directory per class (node logs, sidecar reports), removed after the class,
    also when ``setUpClass`` fails (``CustomTestCase`` then calls ``tearDownClass``); copied
    first under ``$SGLANG_OVERLAY_TEST_KEEP_LOGS`` when that is set."""

    workdir: Path

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix=f"overlay-{cls.__name__}-")
        cls.workdir = Path(cls._tmp.name)

    @classmethod
    def tearDownClass(cls):
        if keep := os.environ.get(KEEP_LOGS_ENV):
            target = Path(keep) / f"{cls.__name__}-{time.strftime('%Y%m%dT%H%M%S')}"
            shutil.copytree(cls.workdir, target, ignore=shutil.ignore_patterns("*.sock"),
                            symlinks=True, dirs_exist_ok=True)  # fmt: skip
        cls._tmp.cleanup()


class DeploymentTestCase(NodesTestCase):
    """A class whose tests share one launched deployment. ``start`` enters everything it
    starts (nodes, Dynamo's processes, environment patches, the large-launch gate) into the
    class's exit stack and lists its nodes in ``cls.started``; the stack is closed after the
    last test, or at once when ``start`` fails, after printing the started nodes' logs (they
    say why)."""

    started: list[nodes.Node]

    @classmethod
    def start(cls, stack: contextlib.ExitStack) -> None:
        raise NotImplementedError

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._stack = contextlib.ExitStack()
        cls.started = []
        try:
            cls.start(cls._stack)
        except BaseException:
            nodes.print_logs(cls.started)
            cls._stack.close()
            raise

    def assert_seed_pass(self, measured: seed_checks.Measured) -> None:
        """``measured``'s row on stderr, then its counts asserted; when they fall short, every
        log in the class's directory (nodes, sidecars, frontend, routers) first gets its tail
        printed, since the directory goes with the class and a stalled request says little by
        itself."""
        measured.report()
        try:
            measured.assert_seed_pass()
        except AssertionError:
            print_log_tails(self.workdir)
            raise

    def assert_fault_row(self, cell: fault_rows.Cell) -> None:
        """``cell``'s row of the fault table on stderr, then no miss of its goal; the logs'
        tails first when it misses."""
        release = releases.installed_sglang_version() or ""
        sys.stderr.write(f"[{release}] fault table: {cell.summary()}\n")
        if cell.problems:
            print_log_tails(self.workdir)
        self.assertEqual(cell.problems, [], cell.summary())

    @classmethod
    def tearDownClass(cls):
        try:
            cls._stack.close()
        finally:
            super().tearDownClass()


def print_log_tails(directory: Path, lines: int = 60) -> None:
    """The last ``lines`` lines of every ``*.log`` under ``directory``, on stderr."""
    for log in sorted(directory.rglob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        sys.stderr.write(f"--- {log.relative_to(directory)} (tail) ---\n" + "\n".join(tail) + "\n")
