"""The overlay's SGLang plugin against the installed SGLang's real plugin framework.

CPU-only, no processes launched: SGLang's ``load_plugins_by_group`` discovers the entry point
from the installed wheel's metadata, and the plugin registers into SGLang's ``HookRegistry``.
The registry is restored after each test.
"""

import logging
import os
import unittest
from unittest import mock

from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay import plugin, releases
from sglang_sidecar_overlay.adapters._node_launch import PROCESS

register_cpu_ci(est_time=1, suite="base-a-test-cpu")

PLUGIN_NAME = "sidecar_overlay"


class TestSidecarOverlayPlugin(CustomTestCase):
    def setUp(self):
        super().setUp()
        self._hooks = {target: list(hooks) for target, hooks in HookRegistry._hooks.items()}
        self._patched = set(HookRegistry._patched)
        self._state = (PROCESS.loaded, PROCESS.adapter)
        PROCESS.loaded, PROCESS.adapter = False, None
        # Another test in this process may already have loaded the plugin (SGLang's own
        # entry points do): start from a registry without our hooks, restored afterwards.
        for hooks in HookRegistry._hooks.values():
            hooks[:] = [entry for entry in hooks if not _is_ours(entry[1])]

    def tearDown(self):
        HookRegistry._hooks.clear()
        HookRegistry._hooks.update(self._hooks)
        HookRegistry._patched.clear()
        HookRegistry._patched.update(self._patched)
        PROCESS.loaded, PROCESS.adapter = self._state
        super().tearDown()

    def _our_targets(self) -> dict:
        return {
            target: [hook for _type, hook, _src in hooks if _is_ours(hook)]
            for target, hooks in HookRegistry._hooks.items()
            if any(_is_ours(hook) for _type, hook, _src in hooks)
        }

    def test_entry_point_is_discovered_and_allow_listing_is_respected(self):
        with mock.patch.dict(os.environ, {"SGLANG_PLUGINS": PLUGIN_NAME}):
            found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
        self.assertIn(PLUGIN_NAME, found)
        self.assertIs(found[PLUGIN_NAME][0], plugin.load)
        with mock.patch.dict(os.environ, {"SGLANG_PLUGINS": "some_other_plugin"}):
            self.assertNotIn(PLUGIN_NAME, load_plugins_by_group(GENERAL_PLUGINS_GROUP))

    def test_load_registers_the_installed_release_adapter_once(self):
        plugin.load()
        plugin.load()
        expected = releases.adapter_for(releases.installed_sglang_version())
        self.assertEqual(plugin.installed_adapter(), expected)
        targets = self._our_targets()
        self.assertTrue(targets)
        for target, hooks in targets.items():
            self.assertEqual(len(hooks), 1, f"{target} hooked {len(hooks)} times")

    def test_unsupported_version_warns_once_and_installs_nothing(self):
        with (
            mock.patch.object(releases, "installed_sglang_version", return_value="0.5.18"),
            self.assertLogs("sglang_sidecar_overlay.plugin", logging.WARNING) as logs,
        ):
            plugin.load()
            plugin.load()
        self.assertEqual(len(logs.records), 1)
        self.assertIn(releases.SUPPORTED_RANGE, logs.output[0])
        self.assertIn("0.5.18", logs.output[0])
        self.assertIsNone(plugin.installed_adapter())
        self.assertEqual(self._our_targets(), {})


def _is_ours(hook) -> bool:
    return getattr(hook, "__module__", "").startswith("sglang_sidecar_overlay.")


if __name__ == "__main__":
    unittest.main()
