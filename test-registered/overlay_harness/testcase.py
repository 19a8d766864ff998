"""The test case the tier's engine-launching classes start from."""

from __future__ import annotations

import tempfile
from pathlib import Path

from sglang.test.test_utils import CustomTestCase

from overlay_harness import cluster


class TinyModelTestCase(CustomTestCase):
    """One working directory per class, holding the config-only model every node loads
    (``workdir/tiny-llama``); removed after the class, also when ``setUpClass`` fails
    (``CustomTestCase`` then calls ``tearDownClass``)."""

    workdir: Path
    model: Path

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix=f"overlay-{cls.__name__}-")
        cls.workdir = Path(cls._tmp.name)
        cls.model = cluster.write_tiny_model(cls.workdir / "tiny-llama")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()
