"""``sglang-sidecar-overlay status`` against the installed SGLang, as an operator runs it.

CPU-only, no GPU part involved: the CLI reads the installed SGLang's metadata and entry
points in a subprocess of this environment.
"""

import json
import os
import subprocess
import sys
import unittest
from importlib import metadata

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=1, suite="base-a-test-cpu")

LEGACY_ENV = "SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE"


def run_status(**env_overrides: str) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", LEGACY_ENV)}
    env.update(env_overrides)
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_sidecar_overlay", "status", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return proc.returncode, json.loads(proc.stdout)


class TestStatusWithInstalledSGLang(CustomTestCase):
    def test_supported_release_is_reported_active(self):
        code, report = run_status()
        installed = metadata.version("sglang")
        self.assertEqual(code, 0, report)
        self.assertTrue(report["active"], report)
        self.assertEqual(report["sglang"]["version"], installed)
        self.assertTrue(report["sglang"]["supported"])
        self.assertEqual(report["sglang"]["adapter"], releases.adapter_for(installed))
        self.assertTrue(report["plugin"]["entry_point_visible"])
        self.assertTrue(report["plugin"]["allowed"])
        self.assertTrue(report["native"]["importable"])
        self.assertFalse(report["legacy_dp_size"]["enabled"])

    def test_allow_list_without_the_overlay_is_reported_inactive(self):
        code, report = run_status(SGLANG_PLUGINS="some_other_plugin")
        self.assertEqual(code, 1, report)
        self.assertFalse(report["active"])
        self.assertFalse(report["plugin"]["allowed"])
        self.assertTrue(any("SGLANG_PLUGINS" in reason for reason in report["reasons"]), report)

    def test_legacy_dp_size_switch_is_shown(self):
        code, report = run_status(**{LEGACY_ENV: "1"})
        self.assertEqual(code, 0, report)
        self.assertTrue(report["legacy_dp_size"]["enabled"])


if __name__ == "__main__":
    unittest.main()
