"""The ``--sidecar`` supervisor (server side), its stdlib-only shim (child side) and the /proc
process-tree helpers both use. Kept import-free so the shim's interpreter loads nothing more."""
