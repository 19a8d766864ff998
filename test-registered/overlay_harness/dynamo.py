"""NVIDIA Dynamo's released parts as this tier runs them: no etcd, no NATS.

The released SGLang sidecar (``dynamo.sglang.sidecar``, ai-dynamo 1.6.1) runs as a node's
``--sidecar``; Dynamo's standalone KV router (``python -m dynamo.router``) runs on the leader's
host. Discovery goes through files in a private directory (``DYN_FILE_KV``, one per group, since
leftover files mislead the next group), requests over TCP, events over ZMQ; every Dynamo
process advertises its host's address, so the router reaches a follower's relay over the
test's bridge.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from overlay_harness import differences, inside, netns, probes
from overlay_harness.nodes import wait_for

DYNAMO = "dynamo.sglang.sidecar"
WAITING_FOR_LEADER = "Waiting for SGLang leader for local KV publishing"
RANK_OUTSIDE_DP_SIZE = "KV source rank 1 is outside dp_size 1"
# Discovery through files in a private directory, TCP requests, ZMQ events.
TRANSPORT_ARGS = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
TRANSPORT_ENV = {"DYN_DISCOVERY_BACKEND": "file", "DYN_REQUEST_PLANE": "tcp",
                 "DYN_EVENT_PLANE": "zmq"}  # fmt: skip
# What the leader's sidecar registers by default, and the router's own endpoints.
WORKER_ENDPOINT = "dynamo.backend.generate"
OVERLAP_SCORES = "dynamo.router.get_overlap_scores"
ROUTER_GENERATE = "dynamo.router.generate"
# The leader's flag the released sidecar checks in server info.
LEADER_ARGS = ["--incremental-streaming-output"]
ROUTER_DEADLINE = 180.0


def consumer_environ(workdir: Path, *, legacy: bool | None) -> dict[str, str]:
    """This process's environment for a group whose nodes run Dynamo: no inherited
    ``DYN_``/``NATS_``/``ETCD_`` setting, file discovery in a fresh directory under
    ``workdir``, plain logs, and the ``dp_size`` switch set under both names (``legacy`` True
    or False) or left unset (None: the overlay's default for this consumer; the upstream
    series has no such default, so its switch is set there: patches/DIFFERENCES.md)."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DYN_", "NATS_", "ETCD_"))
        and key not in differences.DP_SIZE_SWITCH_NAMES
    }
    environ.update(
        TRANSPORT_ENV,
        DYN_FILE_KV=str(workdir / f"discovery-{uuid.uuid4().hex}"),
        DYN_LOG="info",
        DYN_SDK_DISABLE_ANSI_LOGGING="1",
        NO_COLOR="1",
    )
    if legacy is not None:
        environ.update(differences.dp_size_switch(legacy))
    elif differences.differs(differences.DYNAMO_SWITCH_DEFAULT):
        environ.update(differences.dp_size_switch(True))
    return environ


def sidecar_args(*, follower: bool, endpoint: str) -> list[str]:
    """``--sidecar-args`` for Dynamo's sidecar on a node whose gRPC server is at ``endpoint``.

    The plugin hands the endpoint to this consumer in ``DYN_SIDECAR_GRPC_ENDPOINT``; the
    upstream series sets only ``SGLANG_GRPC_ENDPOINT`` (patches/DIFFERENCES.md), so there the
    operator passes ``--grpc-endpoint``, as with stock SGLang."""
    args = [*(["--sidecar-on-followers"] if follower else []), "--sidecar-shutdown-timeout",
            "10", *TRANSPORT_ARGS]  # fmt: skip
    if differences.differs(differences.DYNAMO_ENDPOINT_ENV):
        args += ["--grpc-endpoint", endpoint]
    return args


class Router:
    """Dynamo's standalone KV router on ``host`` (the leader's), routing to the leader's
    registered worker with the group's page size; its log in ``log_path``."""

    def __init__(self, host: netns.Host | None, block_size: int, log_path: Path):
        self.host = host
        self.log_path = log_path
        self.argv = [sys.executable, "-m", "dynamo.router", "--endpoint", WORKER_ENDPOINT,
                     "--router-block-size", str(block_size)]  # fmt: skip
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                host.command(self.argv) if host is not None else self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def overlap(self, token_ids: list[int]) -> dict[int, int]:
        """Matched device blocks per DP rank of the registered worker, as the router sees them."""
        (scores,) = inside.run(
            self.host, probes.dynamo_call, OVERLAP_SCORES, {"token_ids": token_ids}
        )
        return {worker["dp_rank"]: worker["device_blocks"] for worker in scores["workers"]}

    def wait_for_ranks(self, ranks: set[int], token_ids: list[int]) -> dict[int, int]:
        """The overlap scores once the router knows exactly ``ranks``."""
        return wait_for(
            lambda: (scores := self._overlap_or_none(token_ids)) is not None
            and set(scores) == ranks
            and scores,
            ROUTER_DEADLINE,
            f"the router to see DP ranks {sorted(ranks)}",
        )

    def _overlap_or_none(self, token_ids: list[int]) -> dict[int, int] | None:
        with contextlib.suppress(AssertionError):
            return self.overlap(token_ids)
        return None

    def generate(self, token_ids: list[int], max_tokens: int) -> dict:
        """One request through the router's ``generate``, unpinned: the DP rank it was routed
        to and the cached tokens the engine reported."""
        request = {
            "token_ids": token_ids,
            "stop_conditions": {"max_tokens": max_tokens, "ignore_eos": True},
            "sampling_options": {"temperature": 0.0},
        }
        items = inside.run(self.host, probes.dynamo_call, ROUTER_GENERATE, request)
        routed = next(i["routing_data"]["worker_id"] for i in items if "routing_data" in i
                      and "worker_id" in (i["routing_data"] or {}))  # fmt: skip
        usage = next(i["completion_usage"] for i in items if i.get("completion_usage"))
        return {
            "prefill_dp_rank": routed["prefill_dp_rank"],
            "decode_dp_rank": routed["decode_dp_rank"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "prompt_tokens": usage["prompt_tokens"],
        }

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)
