"""The server-info contract: endpoints, KV sources, the builder, redaction, the legacy
``dp_size`` switch, the schema, and the KV-event stream's wire format (``events``).

Pure: nothing here imports SGLang. Data flows publisher -> ``sources.describe_source`` ->
``sources.aggregate_sources`` -> ``server_info.build_server_info`` (the one builder, for leader
and follower) -> ``server_info.render_server_info`` -> the metadata server.
"""
