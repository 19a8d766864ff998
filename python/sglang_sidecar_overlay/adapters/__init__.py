"""One adapter module per SGLang API generation; ``releases.adapter_for`` picks one.

Each adapter exposes ``register(registry, hook_type, *, main_process)`` and is imported only
by the plugin, in a process where SGLang is installed. An adapter declares only what differs
between releases (``_launch.Adapter``); what both generations share lives in modules named by
their job: ``_node_launch`` (one launch of a node, and the process's one piece of state),
``_plan`` (which hook groups a launch needs), ``_launch`` (the launch hook itself),
``_sglang`` (reads of SGLang's runtime state), ``_hooks`` (registering hook groups),
``_publisher`` (publisher read-back, schedulers),
``_server_info`` (the builder's inputs, engine), ``_http_route`` (the ``/server_info`` route),
``_follower`` (a follower's metadata server and its scheduler crash watch), ``_sidecar``
(``--sidecar``), ``_side_channel`` (sources past a pre-0.5.22 DP controller) and
``_disagg_dp_rank`` (the prefill sender's bootstrap rank).
"""
