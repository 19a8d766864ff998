"""A CPU stand-in for SGLang's scheduler process: everything but the model.

Launched by SGLang's own launch code (``Engine`` or the DP controller) in place of
``run_scheduler_process``, with the same signature, in a spawned process. It does what the
real one does before touching a GPU: ``load_plugins()``, resolve and publish its ranks, create
the KV-events publisher through SGLang's ``SchedulerKvEventsPublisher`` (so the real factory
and rank selection run), build the ready message with SGLang's real
``Scheduler.get_init_info`` and send it over the real ready pipe. Then it idles until its
parent goes away or it is signalled, as a scheduler waiting for work would.
"""

from __future__ import annotations

import inspect
import multiprocessing
import multiprocessing.connection
import time
from typing import Any

MAX_TOTAL_NUM_TOKENS = 4096


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


def run_standin_scheduler(
    server_args: Any,
    port_args: Any,
    gpu_id: int,
    tp_rank: int,
    pp_rank: int,
    dp_rank: Any,
    pipe_writer: Any,
    *display_ranks: Any,
) -> None:
    from sglang.srt.managers import scheduler as scheduler_mod
    from sglang.srt.managers.scheduler_components.kv_events_publisher import (
        SchedulerKvEventsPublisher,
    )
    from sglang.srt.runtime_context import get_observability, get_schedule

    scheduler_mod.load_plugins()
    dp_rank = scheduler_mod.resolve_spawn_dp_rank(dp_rank)
    scheduler_mod.publish(
        server_args,
        role="scheduler",
        ranks=scheduler_mod.SpawnRanks(
            world_rank=scheduler_mod.spawn_world_rank(
                server_args, tp_rank=tp_rank, pp_rank=pp_rank
            ),
            dp_rank=dp_rank,
            gpu_id=gpu_id,
        ),
    )
    kv_events_publisher = SchedulerKvEventsPublisher(
        kv_events_config=get_observability().kv_events_config,
        tree_cache=None,
        send_metrics_from_scheduler=None,
        max_running_requests=1,
        max_total_num_tokens=MAX_TOTAL_NUM_TOKENS,
        get_stats=lambda: None,
    )
    from sglang.srt.observability.startup_time import build_scheduler_startup_time

    standin = _standin_scheduler_class(scheduler_mod.Scheduler)()
    standin.max_total_num_tokens = MAX_TOTAL_NUM_TOKENS
    standin.max_req_input_len = MAX_TOTAL_NUM_TOKENS - 1
    standin.startup_time = _startup_time(build_scheduler_startup_time)
    standin.page_size = get_schedule().page_size
    standin.enable_hierarchical_cache = False
    standin.kv_events_publisher = kv_events_publisher
    standin.server_args = server_args
    standin.tp_rank = tp_rank
    pipe_writer.send(scheduler_mod.Scheduler.get_init_info(standin))

    parent = multiprocessing.parent_process()
    if parent is not None:
        multiprocessing.connection.wait([parent.sentinel])
    else:  # pragma: no cover - always spawned by SGLang
        time.sleep(3600)
