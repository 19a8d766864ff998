"""The follower metadata server: lifecycle around the native ``_native.MetadataServer``
(GetServerInfo + grpc.health.v1 + reflection), bound to the node's scheduler processes. Pure
core: no SGLang import."""
