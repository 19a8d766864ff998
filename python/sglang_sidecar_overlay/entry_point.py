"""How SGLang finds the overlay: its plugin entry point, distribution and allow-list variable.

The one place these names are written: ``pyproject.toml`` declares the entry point under the
same group and name (a test keeps them equal), the plugin and ``status`` read them here, and
``scripts/`` load this file by path before the package is installed. Constants only.
"""

# SGLang's ``load_plugins()`` loads every entry point of this group.
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "sidecar_overlay"
DIST_NAME = "sglang-sidecar-overlay"
# SGLang's allow-list: unset or empty loads every plugin, else only the comma-separated names.
SGLANG_PLUGINS_ENV = "SGLANG_PLUGINS"
