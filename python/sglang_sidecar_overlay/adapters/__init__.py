"""One adapter module per SGLang API generation; ``versions.adapter_for`` picks one.

Each adapter exposes ``register(registry, hook_type, *, main_process)`` and is imported only
by the plugin, in a process where SGLang is installed. Shared translation lives in
``_common``.
"""
