"""NVIDIA Dynamo's released SGLang consumer as this tier runs it: no etcd, no NATS."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

DYNAMO = "dynamo.sglang.sidecar"
WAITING_FOR_LEADER = "Waiting for SGLang leader for local KV publishing"
# Discovery through files in a private directory, TCP requests, ZMQ events.
TRANSPORT_ARGS = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
LEGACY_ENV = "SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE"
# The same switch in the upstream patch series (patches/), set alongside so the scenarios run
# unchanged against the rebuilt wheel.
UPSTREAM_LEGACY_ENV = "SGLANG_SERVER_INFO_LEGACY_DP_SIZE"


def consumer_environ(workdir: Path, *, legacy: bool) -> dict[str, str]:
    """This process's environment for a group whose nodes run the consumer: no inherited
    ``DYN_``/``NATS_``/``ETCD_`` setting, file discovery in a fresh directory under
    ``workdir``, plain logs, and the ``dp_size`` switch under both names."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DYN_", "NATS_", "ETCD_"))
    }
    environ.update(
        DYN_FILE_KV=str(workdir / f"discovery-{uuid.uuid4().hex}"),
        DYN_LOG="info",
        DYN_SDK_DISABLE_ANSI_LOGGING="1",
        NO_COLOR="1",
    )
    environ[LEGACY_ENV] = environ[UPSTREAM_LEGACY_ENV] = "1" if legacy else "0"
    return environ
