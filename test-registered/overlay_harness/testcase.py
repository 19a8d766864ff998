"""The test case the tier's engine-launching classes start from."""

from __future__ import annotations

import tempfile
from pathlib import Path

from sglang.test.test_utils import CustomTestCase


class NodesTestCase(CustomTestCase):
    """One working directory per class (node logs, sidecar reports), removed after the class,
    also when ``setUpClass`` fails (``CustomTestCase`` then calls ``tearDownClass``)."""

    workdir: Path

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix=f"overlay-{cls.__name__}-")
        cls.workdir = Path(cls._tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()
