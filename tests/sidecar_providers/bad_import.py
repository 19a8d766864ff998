"""Fails while being imported."""

raise ImportError("sidecar provider fixture: this module cannot be imported")
