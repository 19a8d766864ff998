"""Shared harness for the overlay's SGLang-backed tests: SGLang's real schedulers on the CPU.

``group`` plans an engine group's launches (the tiny config-only model in ``models/``, the CPU
test platform of ``cpu_platform/``); ``nodes`` starts and stops node processes
(``node_process``, SGLang's own launch path) and asks them things through ``inside`` on their
hosts (``netns``); ``probes`` are the clients; ``kv_events`` the real events; ``dynamo`` the
released Dynamo sidecar and router; ``scheduler_faults`` the faults injected into real
schedulers; ``pd`` a prefill/decode router and the prefill's transfer metrics; ``gate`` the
machine-wide lock a large topology holds. Nothing here stands in for a scheduler.
"""
