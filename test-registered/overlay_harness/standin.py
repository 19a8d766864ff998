"""A CPU stand-in for SGLang's scheduler process: everything but the model.

Launched by SGLang's own launch code (``Engine`` or the DP controller) in place of
``run_scheduler_process``, with the same signature, in a spawned process. It does what the real
one does before touching a GPU: ``load_plugins()``, resolve and publish its ranks, create the
KV-events publisher through SGLang's ``SchedulerKvEventsPublisher`` (so the real factory and
rank selection run), build the ready message with SGLang's real ``Scheduler.get_init_info`` and
send it over the real ready pipe. Then it idles until its parent goes away or it is signalled,
as a scheduler waiting for work would, answering the one control request a running frontend
sends on its own: ``GetInternalStateReq`` (HTTP ``/server_info``). Like a real scheduler of rank
zero in its attention-TP group, it pulls requests from ``port_args.scheduler_input_ipc_name``
(the tokenizer manager's socket, or its worker socket from the DP controller) and pushes the
reply to ``port_args.tokenizer_ipc_name``. It does not relay requests to the other ranks of its
group (a real one broadcasts over its torch process group, which no stand-in has), so under
attention DP every group is reached only with ``--enable-dp-attention-local-control-broadcast``
(the DP controller then sends control requests to every group's rank zero, and groups of one
rank need no relay). The reply carries what every supported release's
``Scheduler.get_internal_state`` starts from, the resolved server args
(``get_context().resolved_server_args_dict()``), not the model-dependent counters.
"""

from __future__ import annotations

import inspect
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from typing import Any

MAX_TOTAL_NUM_TOKENS = 4096
# Fault injection for tests: "kill_before_ready" SIGKILLs the stand-in before it reports ready;
# "kill_after_ready" SIGKILLs it with its ready message on the way: the message reaches the
# node only once the stand-in is dead (``_ready_after_death``), so the node learns of the
# death only after it has taken the scheduler as ready.
FAULT_ENV = "OVERLAY_HARNESS_SCHEDULER_FAULT"
CONTROL_POLL_MS = 500
# Test knob: on a follower node (``--node-rank >= 1``), SGLang's per-rank endpoint offset
# (``ZmqEventPublisher.offset_endpoint_port``) is dropped, so with an ``ipc://`` kv-events
# endpoint every publisher of the node binds the same path (libzmq replaces the socket file)
# and reports it: a misconfigured node whose ranks claim one address. SGLang never does this.
SHARED_KV_ENDPOINT_ENV = "OVERLAY_HARNESS_FOLLOWER_SHARES_KV_ENDPOINT"


def _startup_time(builder: Any) -> Any:
    """SGLang's own startup-time record, every phase zero."""
    params = inspect.signature(builder).parameters
    # Phases are seconds; CUDA-graph capture is a per-phase mapping (None: none captured).
    return builder(**{name: None if "graph" in name else 0.0 for name in params})


def _standin_scheduler_class(scheduler_cls: type) -> type:
    # Only what get_init_info reads: the real method runs, hooks included.
    namespace: dict[str, Any] = {}
    for name in ("_hicache_l3_layout",):
        if name in scheduler_cls.__dict__:
            namespace[name] = scheduler_cls.__dict__[name]
    return type("StandinScheduler", (), namespace)


def run_standin_scheduler(*args: Any, **kwargs: Any) -> None:
    """Same arguments as the installed release's ``run_scheduler_process``."""
    from sglang.srt.managers import scheduler as scheduler_mod
    from sglang.srt.observability.startup_time import build_scheduler_startup_time
    from sglang.srt.runtime_context import get_schedule

    bound = inspect.signature(scheduler_mod.run_scheduler_process).bind(*args, **kwargs)
    ranks = bound.arguments
    server_args = ranks["server_args"]
    # As the real scheduler process does first, so its log lines (the overlay's included)
    # reach the node's log in the node's format.
    scheduler_mod.configure_logger(server_args, prefix=f" TP{ranks['tp_rank']}")
    scheduler_mod.load_plugins()
    if os.environ.get(SHARED_KV_ENDPOINT_ENV) and (server_args.node_rank or 0) >= 1:
        _share_kv_endpoint()
    if hasattr(scheduler_mod, "SpawnRanks"):
        kv_events_publisher = _publisher_0_5_21(scheduler_mod, server_args, ranks)
    else:
        kv_events_publisher = _publisher_0_5_19(scheduler_mod, server_args, ranks)

    standin = _standin_scheduler_class(scheduler_mod.Scheduler)()
    standin.max_total_num_tokens = MAX_TOTAL_NUM_TOKENS
    standin.max_req_input_len = MAX_TOTAL_NUM_TOKENS - 1
    standin.startup_time = _startup_time(build_scheduler_startup_time)
    standin.page_size = get_schedule().page_size
    standin.enable_hierarchical_cache = False
    standin.kv_events_publisher = kv_events_publisher
    standin.server_args = server_args
    if os.environ.get(FAULT_ENV) == "kill_before_ready":
        os.kill(os.getpid(), signal.SIGKILL)
    control = ControlChannel(ranks["port_args"]) if _is_group_rank_zero(ranks) else None
    ready = scheduler_mod.Scheduler.get_init_info(standin)
    if os.environ.get(FAULT_ENV) == "kill_after_ready":
        _ready_after_death(ranks["pipe_writer"], ready)
    ranks["pipe_writer"].send(ready)

    parent = multiprocessing.parent_process()
    if parent is None:  # pragma: no cover - always spawned by SGLang
        time.sleep(3600)
        return
    # While the node lives, a publisher rank emits a small real event batch now and then, so
    # a subscriber (a --sidecar, a probe) that joins at any moment receives one.
    publisher = getattr(kv_events_publisher, "kv_event_publisher", None)
    idle_wait = 0.0 if control is not None else CONTROL_POLL_MS / 1000
    while not multiprocessing.connection.wait([parent.sentinel], timeout=idle_wait):
        if control is not None:
            control.serve(CONTROL_POLL_MS)
        if publisher is not None:
            publisher.publish(_cleared_batch())


def _share_kv_endpoint() -> None:
    """Every rank's publisher binds the configured endpoint itself (see the knob above)."""
    from sglang.srt.disaggregation.kv_events import ZmqEventPublisher

    ZmqEventPublisher.offset_endpoint_port = staticmethod(lambda endpoint, rank: endpoint)


def _ready_after_death(pipe_writer: Any, ready: dict) -> None:
    """Hand the ready message to a forked child that sends it once this process is dead, then
    SIGKILL this process. The child learns of the death from EOF on a pipe only this process
    writes to; it only sends and exits."""
    death_r, death_w = os.pipe()
    if os.fork() == 0:
        os.close(death_w)
        os.read(death_r, 1)
        pipe_writer.send(ready)
        os._exit(0)
    os.close(death_r)
    os.kill(os.getpid(), signal.SIGKILL)


def _is_group_rank_zero(ranks: dict) -> bool:
    """Rank zero of its attention-TP group in the first PP stage: the scheduler SGLang gives
    the tokenizer-facing sockets (``Scheduler.init_ipc_channels``)."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    try:  # 0.5.22+: the attention-DP width has its own name (dp_size is the replicas')
        attn_dp_size = parallel.attn_dp_size
    except (AttributeError, RuntimeError, ValueError):
        attn_dp_size = parallel.dp_size if parallel.enable_dp_attention else 1
    attn_tp_size = max(parallel.tp_size // attn_dp_size, 1)
    return ranks["pp_rank"] == 0 and ranks["tp_rank"] % attn_tp_size == 0


class ControlChannel:
    """The scheduler's request socket and reply socket, SGLang's own helpers and framing."""

    def __init__(self, port_args: Any):
        import zmq
        from sglang.srt.utils.network import get_zmq_socket

        self._context = zmq.Context(1)
        # connect, as Scheduler.init_ipc_channels does (the tokenizer side binds).
        self._recv = get_zmq_socket(
            self._context, zmq.PULL, port_args.scheduler_input_ipc_name, False
        )
        self._send = get_zmq_socket(self._context, zmq.PUSH, port_args.tokenizer_ipc_name, False)
        self._poller = zmq.Poller()
        self._poller.register(self._recv, zmq.POLLIN)

    def serve(self, timeout_ms: int) -> None:
        """Answer the requests that arrive within ``timeout_ms``; ignore everything else."""
        import zmq
        from sglang.srt.managers.io_struct import (
            GetInternalStateReq,
            GetInternalStateReqOutput,
            sock_recv,
            sock_send,
        )
        from sglang.srt.runtime_context import get_context
        from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

        if not self._poller.poll(timeout_ms):
            return
        while True:
            try:
                request = sock_recv(self._recv, zmq.NOBLOCK)
            except zmq.Again:
                return
            if isinstance(request, GetInternalStateReq):
                state = get_context().resolved_server_args_dict()
                # As the real one: a bound signal handler is not msgpack-serializable.
                state.pop("custom_sigquit_handler", None)
                reply = GetInternalStateReqOutput(internal_state=msgspec_to_builtins(state))
                sock_send(self._send, reply)


def _cleared_batch() -> Any:
    from sglang.srt.disaggregation.kv_events import AllBlocksCleared, KVEventBatch

    return KVEventBatch(ts=time.time(), events=[AllBlocksCleared()])


def _publisher_0_5_21(scheduler_mod: Any, server_args: Any, ranks: dict) -> Any:
    """0.5.21+: ranks published with the process; the publisher reads get_parallel()."""
    from sglang.srt.managers.scheduler_components.kv_events_publisher import (
        SchedulerKvEventsPublisher,
    )
    from sglang.srt.runtime_context import get_observability

    dp_rank = scheduler_mod.resolve_spawn_dp_rank(ranks.get("dp_rank"))
    scheduler_mod.publish(
        server_args,
        role="scheduler",
        ranks=scheduler_mod.SpawnRanks(
            world_rank=scheduler_mod.spawn_world_rank(
                server_args, tp_rank=ranks["tp_rank"], pp_rank=ranks["pp_rank"]
            ),
            dp_rank=dp_rank,
            gpu_id=ranks["gpu_id"],
        ),
    )
    return SchedulerKvEventsPublisher(
        kv_events_config=get_observability().kv_events_config,
        tree_cache=None,
        send_metrics_from_scheduler=None,
        max_running_requests=1,
        max_total_num_tokens=MAX_TOTAL_NUM_TOKENS,
        get_stats=lambda: None,
    )


def _publisher_0_5_19(scheduler_mod: Any, server_args: Any, ranks: dict) -> Any:
    """0.5.19–0.5.20: the scheduler builds a ParallelState and hands it to the publisher."""
    from sglang.srt.distributed.parallel_state_wrapper import ParallelState
    from sglang.srt.layers.dp_attention import compute_dp_attention_world_info
    from sglang.srt.managers.scheduler_components.kv_events_publisher import (
        SchedulerKvEventsPublisher,
    )
    from sglang.srt.runtime_context import get_observability, get_parallel

    scheduler_mod.publish(server_args, role="scheduler")
    tp_rank = ranks["tp_rank"]
    dp_rank = scheduler_mod.configure_scheduler_process(
        server_args,
        ranks["gpu_id"],
        tp_rank,
        ranks["attn_cp_rank"],
        ranks["moe_dp_rank"],
        ranks["moe_ep_rank"],
        ranks["pp_rank"],
        ranks.get("dp_rank"),
    )
    parallel = get_parallel()
    # The same placement arithmetic the real Scheduler.__init__ does before any GPU work.
    attn_tp_rank, attn_tp_size, attn_dp_rank, attn_dp_size = compute_dp_attention_world_info(
        parallel.enable_dp_attention,
        tp_rank,
        parallel.tp_size,
        parallel.dp_size,
        parallel.attn_cp_size,
    )
    ps = ParallelState(
        tp_rank=tp_rank,
        tp_size=parallel.tp_size,
        pp_rank=ranks["pp_rank"],
        pp_size=parallel.pp_size,
        dp_rank=dp_rank,
        dp_size=parallel.dp_size,
        attn_tp_rank=attn_tp_rank,
        attn_tp_size=attn_tp_size,
        attn_cp_rank=ranks["attn_cp_rank"],
        attn_cp_size=parallel.attn_cp_size,
        attn_dcp_rank=tp_rank % parallel.dcp_size,
        attn_dcp_size=parallel.dcp_size,
        attn_dp_rank=attn_dp_rank,
        attn_dp_size=attn_dp_size,
        moe_ep_rank=ranks["moe_ep_rank"],
        moe_ep_size=parallel.ep_size,
        moe_dp_rank=ranks["moe_dp_rank"],
        moe_dp_size=parallel.moe_dp_size,
        gpu_id=ranks["gpu_id"],
    )
    return SchedulerKvEventsPublisher(
        kv_events_config=get_observability().kv_events_config,
        ps=ps,
        attn_tp_rank=ps.attn_tp_rank,
        attn_cp_rank=ps.attn_cp_rank,
        attn_dp_rank=ps.attn_dp_rank,
        dp_rank=ps.dp_rank,
        tree_cache=None,
        send_metrics_from_scheduler=None,
        max_running_requests=1,
        max_total_num_tokens=MAX_TOTAL_NUM_TOKENS,
        get_stats=lambda: None,
    )
