"""Operator tools: the ``sglang-sidecar-overlay`` CLI (``status``, ``probe``, ``selftest``)."""
