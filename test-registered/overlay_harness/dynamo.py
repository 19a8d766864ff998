"""NVIDIA Dynamo's released parts as this tier runs them: no etcd, no NATS.

The released SGLang sidecar (``dynamo.sglang.sidecar``, ai-dynamo 1.6.1, installed in the
SGLang env) runs as a node's ``--sidecar``; Dynamo's standalone KV router
(``python -m dynamo.router``) runs on the leader's host. Discovery goes through files in a
private directory (``DYN_FILE_KV``, one per group, since leftover files mislead the next
group), requests over TCP, events over ZMQ; every Dynamo process advertises its host's
address, so the router reaches a follower's relay over the test's bridge.

The next consumer versions (``next_consumers``: ai-dynamo 1.7 today) each come from an env of
their own (``scripts/envs.py`` builds it and hands its interpreter over in
``SGLANG_OVERLAY_TEST_DYNAMO_PYTHONS``). ``ConsumerSet`` starts one version's sidecar on
every node by hand, pointed at the node's gRPC server, and its router, in a discovery
directory of their own: they run beside the supervised 1.6.1 sidecars of the same launch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from unittest import mock

from overlay_harness import differences, dynamo_client, inside, netns, ports, probes, tokenizer
from overlay_harness.group import TINY_MODEL
from overlay_harness.nodes import wait_for

DYNAMO = "dynamo.sglang.sidecar"
WAITING_FOR_LEADER = "Waiting for SGLang leader for local KV publishing"
RANK_OUTSIDE_DP_SIZE = "KV source rank 1 is outside dp_size 1"
# Discovery through files in a private directory, TCP requests, ZMQ events.
TRANSPORT_ARGS = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
TRANSPORT_ENV = {"DYN_DISCOVERY_BACKEND": "file", "DYN_REQUEST_PLANE": "tcp",
                 "DYN_EVENT_PLANE": "zmq"}  # fmt: skip
# What the leader's sidecar registers by default (in prefill mode: the prefill endpoint), and
# the router's own endpoints.
WORKER_ENDPOINT = "dynamo.backend.generate"
PREFILL_ENDPOINT = "dynamo.prefill.generate"
OVERLAP_SCORES = "dynamo.router.get_overlap_scores"
ROUTER_GENERATE = "dynamo.router.generate"
# The leader's flag the released sidecar checks in server info.
LEADER_ARGS = ["--incremental-streaming-output"]
ROUTER_DEADLINE = 180.0
# A batch of requests through the frontend: 40 of 64 tokens, 4 at a time, on a loaded machine.
REQUESTS_DEADLINE = 900.0
STOP_DEADLINE = 20.0
NEXT_CONSUMERS_ENV = "SGLANG_OVERLAY_TEST_DYNAMO_PYTHONS"


def next_consumers() -> dict[str, str]:
    """{version: interpreter} of the consumer versions run beside the SGLang env's own."""
    raw = os.environ.get(NEXT_CONSUMERS_ENV)
    if not raw:
        raise AssertionError(
            f"{NEXT_CONSUMERS_ENV} is not set: run this tier through scripts/sglang_envs.py, "
            "which builds each next Dynamo version's env"
        )
    return json.loads(raw)


@dataclasses.dataclass(frozen=True)
class Consumer:
    """The Dynamo in front of a launch: the release installed in the SGLang env, run as each
    node's supervised ``--sidecar`` (``python`` None), or a next version (``next_consumers``)
    from its own env, whose sidecars are started beside the nodes (``external_sidecar``)."""

    version: str = "released"
    python: str | None = None

    @property
    def supervised(self) -> bool:
        return self.python is None

    def process_options(self) -> dict:
        """``DynamoProcess`` keywords for this version's processes: its interpreter, and this
        process's environment without the SGLang env's import path."""
        if self.supervised:
            return {}
        environ = dict(os.environ)
        environ.pop("PYTHONPATH", None)
        return {"python": self.python, "environ": environ}


RELEASED = Consumer()


def consumer(version: str | None) -> Consumer:
    """The consumer named ``version``: a next version's, or the released one for None."""
    if version is None:
        return RELEASED
    pythons = next_consumers()
    if version not in pythons:
        raise AssertionError(f"consumer {version!r}: not among the next versions {sorted(pythons)}")
    return Consumer(version, pythons[version])


def external_sidecar(
    consumer: Consumer,
    host: netns.Host | None,
    endpoint: str,
    mode: str | None,
    log_path: Path,
    environ: dict[str, str] | None = None,
) -> DynamoProcess:
    """``consumer``'s sidecar on ``host`` for the node whose gRPC server is at ``endpoint``
    (a URL), serving the engine's disaggregation ``mode`` when given, started by hand as an
    operator runs a sidecar from another image: its role (leader, or relay on a follower) is
    its own choice from the node's ``GetServerInfo``. ``environ`` replaces the consumer's
    environment (a discovery directory of its own, for example)."""
    args = ["--grpc-endpoint", endpoint, *TRANSPORT_ARGS]
    if mode is not None:
        args += ["--disaggregation-mode", mode]
    options = consumer.process_options()
    if environ is not None:
        options["environ"] = environ
    return DynamoProcess(host, DYNAMO, args, log_path, **options)


def consumer_environ(
    workdir: Path, *, legacy: bool | None, consumer: Consumer = RELEASED
) -> dict[str, str]:
    """This process's environment for a group whose nodes run Dynamo: no inherited
    ``DYN_``/``NATS_``/``ETCD_`` setting, file discovery in a fresh directory under
    ``workdir``, plain logs, and the ``dp_size`` switch set under both names (``legacy`` True
    or False) or left unset (None: the overlay's default for this consumer; the upstream
    series has no such default, so for the released consumer its switch is set there:
    patches/DIFFERENCES.md; a next version needs none)."""
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
    elif consumer.supervised and differences.differs(differences.DYNAMO_SWITCH_DEFAULT):
        environ.update(differences.dp_size_switch(True))
    return environ


def enter_consumer(
    stack: contextlib.ExitStack, workdir: Path, consumer: Consumer = RELEASED
) -> list[str]:
    """Sets this process's environment for a group whose nodes run ``consumer`` (the
    ``dp_size`` switch at the overlay's default) until ``stack`` closes, and builds the
    tokenizer the frontend needs in the model card: SGLang's ``--tokenizer-path`` arguments for
    it (SGLang keeps ``--skip-tokenizer-init``: requests carry token ids)."""
    environ = consumer_environ(workdir, legacy=None, consumer=consumer)
    stack.enter_context(mock.patch.dict(os.environ, environ, clear=True))
    return ["--tokenizer-path", str(tokenizer.build(TINY_MODEL, workdir / "tokenizer"))]


def sidecar_args(*, follower: bool, endpoint: str, mode: str | None = None,
                 explicit_endpoint: bool = False) -> list[str]:  # fmt: skip
    """``--sidecar-args`` for Dynamo's sidecar on a node whose gRPC server is at ``endpoint``,
    serving the engine's disaggregation ``mode`` (``prefill`` or ``decode``) when given.

    The plugin hands the endpoint to this consumer in ``DYN_SIDECAR_GRPC_ENDPOINT``; the
    upstream series sets only ``SGLANG_GRPC_ENDPOINT`` (patches/DIFFERENCES.md), so there the
    operator passes ``--grpc-endpoint``, as with stock SGLang (``explicit_endpoint``: a launch
    that must run on every side)."""
    args = [*(["--sidecar-on-followers"] if follower else []), "--sidecar-shutdown-timeout",
            "10", *TRANSPORT_ARGS]  # fmt: skip
    if explicit_endpoint or differences.differs(differences.DYNAMO_ENDPOINT_ENV):
        args += ["--grpc-endpoint", endpoint]
    if mode is not None:
        args += ["--disaggregation-mode", mode]
    return args


class DynamoProcess:
    """One Dynamo module (``python -m MODULE ARGS``) on ``host``, in its own session, with
    ``environ`` (default: this process's) and its output in ``log_path``."""

    def __init__(
        self,
        host: netns.Host | None,
        module: str,
        args: list[str],
        log_path: Path,
        *,
        python: str = sys.executable,
        environ: dict[str, str] | None = None,
    ):
        self.host = host
        self.log_path = log_path
        self.python = python
        self.environ = environ
        self.argv = [python, "-m", module, *args]
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                host.command(self.argv) if host is not None else self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=environ,
            )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=STOP_DEADLINE)


class Router(DynamoProcess):
    """Dynamo's standalone KV router on ``host`` (the leader's), routing to the workers
    registered on ``endpoint`` (the leaders' by default) with the group's page size; its log in
    ``log_path``. ``python`` and ``environ`` choose the Dynamo version and its discovery
    directory; its clients run with the same two."""

    def __init__(
        self,
        host: netns.Host | None,
        block_size: int,
        log_path: Path,
        *,
        endpoint: str = WORKER_ENDPOINT,
        python: str = sys.executable,
        environ: dict[str, str] | None = None,
    ):
        args = ["--endpoint", endpoint, "--router-block-size", str(block_size)]
        super().__init__(host, "dynamo.router", args, log_path, python=python, environ=environ)

    def call(self, endpoint: str, payload: dict) -> list:
        """Every response of one call to ``endpoint``, from this router's host and version."""
        if self.python == sys.executable and self.environ is None:
            return inside.run(self.host, dynamo_client.call, endpoint, payload)
        return inside.run(
            self.host, dynamo_client.call, endpoint, payload,
            python=self.python, environ=self.environ,
        )  # fmt: skip

    def overlap(self, token_ids: list[int]) -> dict[int, int]:
        """Matched device blocks per DP rank of the registered worker, as the router sees them."""
        return {rank: blocks for (_worker, rank), blocks in self.target_scores(token_ids).items()}

    def target_scores(self, token_ids: list[int]) -> dict[tuple[int, int], int]:
        """Matched device blocks per (worker id, DP rank) target, as the router sees them."""
        (scores,) = self.call(OVERLAP_SCORES, {"token_ids": token_ids})
        return {(w["worker_id"], w["dp_rank"]): w["device_blocks"] for w in scores["workers"]}

    def wait_for_ranks(self, ranks: set[int], token_ids: list[int]) -> dict[int, int]:
        """The overlap scores once the router knows exactly ``ranks``."""
        return wait_for(
            lambda: (scores := self._overlap_or_none(token_ids)) is not None
            and set(scores) == ranks
            and scores,
            ROUTER_DEADLINE,
            f"the router to see DP ranks {sorted(ranks)}",
        )

    def registered_ranks(self, token_ids: list[int]) -> set[int]:
        """The DP ranks the router scores, once it scores any: the leader's registration."""
        return set(
            wait_for(
                lambda: self._overlap_or_none(token_ids) or None,
                ROUTER_DEADLINE,
                "the router to score a registered worker",
            )
        )

    def _overlap_or_none(self, token_ids: list[int]) -> dict[int, int] | None:
        if self.proc.poll() is not None:  # no use waiting out a deadline
            raise RuntimeError(
                f"{self.argv} exited {self.proc.returncode}: {self.log_text()[-2000:]}"
            )
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
        items = self.call(ROUTER_GENERATE, request)
        routed = next(i["routing_data"]["worker_id"] for i in items if "routing_data" in i
                      and "worker_id" in (i["routing_data"] or {}))  # fmt: skip
        usage = next(i["completion_usage"] for i in items if i.get("completion_usage"))
        return {
            "prefill_dp_rank": routed["prefill_dp_rank"],
            "decode_dp_rank": routed["decode_dp_rank"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "prompt_tokens": usage["prompt_tokens"],
        }


class PrefillDecodeRouters:
    """Two standalone routers on ``host``, one scoring the prefill workers and one the decode
    workers, the oracle of what a disaggregated deployment's events told a router. Both serve
    the same ``get_overlap_scores`` endpoint (a router's own endpoints are named after its
    workers' namespace), so :meth:`target_scores` asks each instance and merges the answers:
    the prefill and decode workers' ids differ."""

    def __init__(self, host: netns.Host | None, block_size: int, workdir: Path,
                 consumer: Consumer = RELEASED):  # fmt: skip
        self.host = host
        self.options = consumer.process_options()
        self.routers: list[Router] = []
        try:
            for endpoint, name in ((PREFILL_ENDPOINT, "prefill"), (WORKER_ENDPOINT, "decode")):
                log_path = workdir / f"router-{name}.log"
                self.routers.append(
                    Router(host, block_size, log_path, endpoint=endpoint, **self.options)
                )
        except BaseException:
            self.stop()
            raise

    def target_scores(self, token_ids: list[int]) -> dict[tuple[int, int], int]:
        """Matched device blocks per (worker id, DP rank) target, prefill and decode alike."""
        return {target: blocks for scores in self.scores_per_router(token_ids)
                for target, blocks in scores.items()}  # fmt: skip

    def scores_per_router(self, token_ids: list[int]) -> list[dict[tuple[int, int], int]]:
        """Each router's matched device blocks per target: one router knows one kind's
        workers, though which answer is whose is not known."""
        for router in self.routers:
            if router.proc.poll() is not None:  # no use waiting out a deadline
                raise RuntimeError(f"{router.argv} exited {router.proc.returncode}: "
                                   f"{router.log_text()[-2000:]}")  # fmt: skip
        answers = inside.run(self.host, dynamo_client.call_every, OVERLAP_SCORES,
                             {"token_ids": token_ids}, len(self.routers),
                             **self.options)  # fmt: skip
        return [
            {(worker["worker_id"], worker["dp_rank"]): worker["device_blocks"]
             for worker in scores["workers"]}
            for (scores,) in answers
        ]  # fmt: skip

    def stop(self) -> None:
        for router in self.routers:
            router.stop()


def pin(target: tuple[int, int]) -> dict:
    """Frontend ``nvext`` fields pinning a request to an aggregated (worker id, DP rank)."""
    return {"backend_instance_id": target[0], "dp_rank": target[1]}


def pin_disaggregated(prefill: tuple[int, int], decode: tuple[int, int]) -> dict:
    """Frontend ``nvext`` fields pinning a request's prefill and decode (worker id, DP rank)
    (Dynamo 1.6.1 reads ``dp_rank`` as the decode's rank here)."""
    return {"prefill_worker_id": prefill[0], "prefill_dp_rank": prefill[1],
            "decode_worker_id": decode[0], "dp_rank": decode[1]}  # fmt: skip


class Frontend(DynamoProcess):
    """Dynamo's OpenAI-compatible frontend (``python -m dynamo.frontend``) on ``host``, in KV
    router mode, serving HTTP on ``address``, where users' requests enter. It serves a model
    once the leader's sidecar registered it with a tokenizer in its card
    (``overlay_harness.tokenizer``), and copies the card's files under ``$HOME/.cache/dynamo``:
    ``home`` keeps them in the test's directory."""

    def __init__(self, host: netns.Host | None, address: str, home: Path, log_path: Path,
                 consumer: Consumer = RELEASED, *, migration_limit: int = 0):  # fmt: skip
        self.address = address
        self.port = ports.free_port()
        self.model: str | None = None
        args = ["--http-host", address, "--http-port", str(self.port), "--router-mode", "kv",
                "--migration-limit", str(migration_limit), *TRANSPORT_ARGS]  # fmt: skip
        options = consumer.process_options()
        options["environ"] = dict(options.get("environ", os.environ), HOME=str(home))
        super().__init__(host, "dynamo.frontend", args, log_path, **options)

    def wait_for_model(self) -> str:
        """The served model's name, once the frontend lists one (its ``/health`` answers
        before any worker is known)."""

        def listed() -> str | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv} exited {self.proc.returncode}: "
                                   f"{self.log_text()[-2000:]}")  # fmt: skip
            with contextlib.suppress(AssertionError):
                status, text = inside.run(self.host, probes.http_text, self.port, self.address,
                                          "/v1/models")  # fmt: skip
                models = json.loads(text).get("data") if status == 200 else None
                return models[0]["id"] if models else None
            return None

        self.model = wait_for(listed, ROUTER_DEADLINE, "the frontend to list a model")
        return self.model

    def generate_many(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        concurrency: int,
        pinned: dict | None = None,
    ) -> list[dict]:
        """Each prompt as an OpenAI completion through the frontend, pinned where ``pinned``
        (:func:`pin`, :func:`pin_disaggregated`) says when given, up to ``concurrency`` at once:
        per prompt, in order, where it was routed and its tokens (as :func:`frontend_reply`),
        or ``{"error": ...}``."""
        nvext: dict = {"extra_fields": ["worker_id"], **(pinned or {})}
        requests = [[prompt, max_tokens, nvext] for prompt in prompts]
        replies = inside.run(
            self.host, probes.completions, self.port, self.address, self.model, requests,
            concurrency, deadline=REQUESTS_DEADLINE,
        )  # fmt: skip
        return [frontend_reply(r) if "usage" in r else r for r in replies]


def frontend_reply(reply: dict) -> dict:
    """What one completion's ``usage`` and ``nvext.worker_id`` say: the worker and DP ranks it
    was routed to (an aggregated worker is its own prefill and decode worker), the tokens in
    and out, and the cached tokens the engine reported."""
    routed, usage = reply["nvext"]["worker_id"], reply["usage"]
    return {
        "prefill_dp_rank": routed["prefill_dp_rank"],
        "decode_dp_rank": routed["decode_dp_rank"],
        "prefill_worker_id": routed.get("prefill_worker_id"),
        "decode_worker_id": routed.get("decode_worker_id"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage.get("completion_tokens"),
    }


class ConsumerSet:
    """A next Dynamo version (``consumer``) beside the launch's own sidecars: its sidecar on
    every node (``(host, gRPC endpoint)`` pairs, leader first), started by hand with
    ``--grpc-endpoint``, and its router on the leader's host, all in a discovery directory of
    their own under ``workdir``. The node's role (leader, or relay on a follower) is the
    sidecar's own choice from the node's ``GetServerInfo``. ``stop()`` ends them all."""

    def __init__(
        self,
        consumer: Consumer,
        nodes: list[tuple[netns.Host | None, str]],
        block_size: int,
        workdir: Path,
    ):
        if consumer.python is None:
            raise ValueError(
                "ConsumerSet runs a next version from its own env, not the released one"
            )
        self.consumer, self.workdir = consumer, workdir
        self.environ = {
            **consumer.process_options()["environ"],
            "DYN_FILE_KV": str(workdir / f"discovery-{uuid.uuid4().hex}"),
        }
        self.sidecars: list[DynamoProcess] = []
        self.router: Router | None = None
        try:
            for node_rank, (host, endpoint) in enumerate(nodes):
                self.sidecars.append(self.sidecar(host, endpoint, f"node{node_rank}"))
            self.router = Router(
                nodes[0][0],
                block_size,
                self._log("router"),
                python=consumer.python,
                environ=self.environ,
            )
        except BaseException:
            self.stop()
            raise

    def _log(self, name: str) -> Path:
        return self.workdir / f"dynamo-{self.consumer.version}-{name}-{uuid.uuid4().hex[:6]}.log"

    def sidecar(self, host: netns.Host | None, endpoint: str, name: str) -> DynamoProcess:
        """This version's sidecar on ``host`` for the gRPC server at ``endpoint``."""
        return external_sidecar(
            self.consumer, host, f"http://{endpoint}", None, self._log(name), self.environ
        )

    def exited(self) -> list[str]:
        """The sidecars that have exited, with their logs' tails (empty while all run)."""
        return [
            f"{sidecar.argv}: exit {sidecar.proc.returncode}\n{sidecar.log_text()[-2000:]}"
            for sidecar in self.sidecars
            if sidecar.proc.poll() is not None
        ]

    def stop(self) -> None:
        for process in [*self.sidecars, *([self.router] if self.router else [])]:
            process.stop()

    def __enter__(self) -> ConsumerSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
