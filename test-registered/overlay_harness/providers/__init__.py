"""Sidecar provider modules for ``--sidecar`` scenarios (importable by the spawned sidecar)."""
