"""Shared harness for the overlay's SGLang-backed tests (CPU only, no model runs).

``standin`` is the only stand-in: the model-running part of a scheduler. ``node`` drives one
node of an engine group through SGLang's real launch code in its own process.
"""
