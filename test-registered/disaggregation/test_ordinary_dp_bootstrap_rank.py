"""Prefill/decode bootstrap under ordinary DP: which prefill replica a decode rank reaches.

CPU-only. Three prefill shapes: ordinary DP 2 x TP 1 (the seed's failing deployment), attention
DP 2 across two nodes (TP 2), and a single replica; the decode side has two ordinary-DP
replicas. Per load-balance method (the DP controller's four, with the same dispatch code on
0.5.19 through 0.5.23), 40 bootstrap rooms are dispatched to the prefill and to the decode
replicas the way the controller does it (``round_robin``: a counter; ``follow_bootstrap_room``:
``room % replicas``; ``total_requests`` / ``total_tokens``: SGLang's own ``DPBudget``, which
with no load reports alternates).

Each prefill rank first registers its connection info with the real
``CommonKVManager.register_to_bootstrap`` at SGLang's real ``CommonKVBootstrapServer`` (its
aiohttp app on a free loopback port). For each room, the real ``CommonKVSender`` constructor
runs on the replica the room was dispatched to (its ``follow_bootstrap_room`` conflict check
and its ``/register_dp_rank`` post), in a subclass that inherits it as the transfer backends'
senders do (the abstract transfer methods raise; nothing transfers). Then the decode
replica the room went to resolves it as the decode side does:
``DecodePreallocQueue._resolve_prefill_dp_rank`` (over the
``PrefillServerInfo`` the server reports on ``/route``), else
``CommonKVReceiver.query_prefill_dp_ranks``, then
``CommonKVReceiver._get_bootstrap_info_from_server`` for the connection info. A room is
resolved when the prefill sender did not fail it and the decode side got the connection info
of the replica it was dispatched to.

What stands in: each prefill rank's KV manager is SGLang's ``CommonKVManager`` with its
constructor replaced, because that constructor needs the scheduler's torch.distributed groups
and (in a backend) the GPU KV buffers and transfer engine. The stand-in carries the rank fields
the constructor derives (attention-DP rank and size, ``system_dp_size``, the replica's
``system_dp_rank``), its own connection port, and the bookkeeping the real ``update_status``,
``record_failure`` and ``register_to_bootstrap`` read. On the decode side, plain objects carry
the few fields the resolution functions read (a Req's bootstrap host, port and room, the
prealloc queue's ``prefill_info_table``, the receiver's ``bootstrap_addr``). The process
context (``get_parallel()`` and friends) is SGLang's own, published from real server args; all
ranks of a case share one process, and attention DP's two nodes read node 0's context (the
values the sender reads are the same on both nodes).

Each variant runs in its own spawned process, as a scheduler does: "stock" never loads
plugins, so SGLang's code runs unhooked; "overlay" first calls SGLang's ``load_plugins()``,
which registers this project's scheduler-side hooks.
"""

import inspect
import json
import logging
import multiprocessing
import os
import threading
import time
import unittest
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

from overlay_harness import differences, nodes, ports
from overlay_harness.group import TINY_MODEL
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay import entry_point

register_cpu_ci(est_time=29, suite="base-a-test-cpu")

logger = logging.getLogger(__name__)

ROOMS = [7_340_000_000 + i for i in range(40)]
METHODS = ("round_robin", "follow_bootstrap_room", "total_requests", "total_tokens")
DP = 2
VARIANT_DEADLINE = 900.0
SERVER_DEADLINE = 60.0
CONFLICT = "follow_bootstrap_room conflict"
SENDER_INIT = "sglang.srt.disaggregation.common.conn.CommonKVSender.__init__"

# Rank fields per case, as CommonKVManager.__init__ derives them on every supported release:
# (attn_tp_size, attn_tp_rank, attn_dp_size, attn_dp_rank, system_dp_size, system_dp_rank).
ORDINARY_DP_RANKS = [(1, 0, 1, 0, DP, replica) for replica in range(DP)]
ATTENTION_DP_RANKS = [(1, 0, DP, rank, 1, 0) for rank in range(DP)]


# --- everything below runs in the spawned variant process --------------------------------------


def _standin_manager_class() -> type:
    from sglang.srt.disaggregation.base.conn import KVArgs
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.disaggregation.utils import DisaggregationMode

    class StandinKVManager(CommonKVManager):
        """CommonKVManager without its GPU/torch.distributed constructor; see the docstring."""

        def __init__(self, ranks: tuple, bootstrap_port: int, dist_init_addr: str | None):
            attn_tp_size, attn_tp_rank, attn_dp_size, attn_dp_rank, sys_size, sys_rank = ranks
            self.kv_args = KVArgs()
            self.kv_args.engine_rank = attn_dp_rank * attn_tp_size + attn_tp_rank
            self.kv_args.pp_rank = 0
            self.kv_args.page_size = 1
            self.kv_args.system_dp_rank = sys_rank
            self.kv_args.rust_http_port = None
            self.kv_cache_dtype_str = "bfloat16"
            self.kv_layout = None
            self.dsv41_spec_layout = None
            self.disaggregation_mode = DisaggregationMode.PREFILL
            self.bootstrap_host = "127.0.0.1"
            self.bootstrap_port = bootstrap_port
            self.dist_init_addr = dist_init_addr
            self.attn_tp_size, self.attn_tp_rank = attn_tp_size, attn_tp_rank
            self.attn_cp_size, self.attn_cp_rank = 1, 0
            self.attn_dp_size, self.attn_dp_rank = attn_dp_size, attn_dp_rank
            self.system_dp_size, self.system_dp_rank = sys_size, sys_rank
            self.pp_size, self.pp_rank = 1, 0
            self.local_ip = "127.0.0.1"
            self.rank_port = ports.free_port()
            self.is_dummy_cp_rank = False
            self.deferred_bootstrap = None
            self.request_status = {}
            self.failure_records = {}
            self.failure_lock = threading.Lock()
            self._deferred_ack_targets = {}
            self._deferred_ack_poisoned_rooms = set()
            self._staging_outstanding = defaultdict(int)
            self.register_to_bootstrap()

    return StandinKVManager


def _sender_class() -> type:
    """A transfer backend's sender without the transfer: SGLang's constructor, inherited."""
    from sglang.srt.disaggregation.common.conn import CommonKVSender

    def no_transfer(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("no KV transfer in this test")

    # Abstract on some releases (poll, failure_exception); a backend implements them.
    methods = dict.fromkeys(getattr(CommonKVSender, "__abstractmethods__", ()), no_transfer)
    return type("StandinKVSender", (CommonKVSender,), methods)


def _publish(model_dir: str, args: list[str]) -> None:
    from sglang.srt.runtime_context import publish, reset_context
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(
        ["--model-path", model_dir, "--skip-tokenizer-init", "--device", "cpu", *args]
    )
    reset_context()
    publish(server_args, role="scheduler")


def _wait_healthy(port: int) -> None:
    import requests

    deadline = time.monotonic() + SERVER_DEADLINE
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"bootstrap server on port {port} not healthy in {SERVER_DEADLINE} s")


def _dispatch(method: str, replicas: int) -> list[int]:
    """The replica each room goes to, as the DP controller's method picks it."""
    from sglang.srt.managers.data_parallel_controller import DPBudget, LoadBalanceMethod

    if method == "round_robin":
        return [i % replicas for i in range(len(ROOMS))]
    if method == "follow_bootstrap_room":
        return [room % replicas for room in ROOMS]
    budget = DPBudget(replicas)
    return [budget.dispatch(LoadBalanceMethod.from_str(method), 16) for _ in ROOMS]


def _decode_req(room: int, port: int) -> SimpleNamespace:
    """The fields of a decode-side Req that the prefill-rank resolution reads."""
    return SimpleNamespace(
        bootstrap_host="127.0.0.1",
        bootstrap_port=port,
        bootstrap_room=room,
        disagg_prefill_dp_rank=None,
    )


def _run_case(model_dir: str, method: str, rank_fields: list[tuple], server_args: list[str]):
    import requests
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.common.conn import (
        CommonKVBootstrapServer,
        CommonKVReceiver,
        PrefillServerInfo,
    )
    from sglang.srt.disaggregation.decode import DecodePreallocQueue

    port = ports.free_port()
    dist_init_addr = None
    if "--nnodes" in server_args:
        dist_init_addr = f"127.0.0.1:{ports.free_port()}"
        server_args = [*server_args, "--dist-init-addr", dist_init_addr]
    _publish(
        model_dir,
        [
            *server_args,
            *("--load-balance-method", method, "--disaggregation-bootstrap-port", str(port)),
            *("--host", "127.0.0.1", "--port", str(ports.free_port())),
        ],
    )
    server = CommonKVBootstrapServer("127.0.0.1", port)
    try:
        _wait_healthy(port)
        manager_class = _standin_manager_class()
        sender_class = _sender_class()
        managers = [manager_class(ranks, port, dist_init_addr) for ranks in rank_fields]
        addr = f"127.0.0.1:{port}"

        # Prefill: each room's sender on the replica it was dispatched to.
        prefill_of = dict(zip(ROOMS, _dispatch(method, len(managers)), strict=True))
        failures = {}
        # 0.5.19-0.5.21 also take the destination TP ranks and the PP rank.
        extra = {}
        params = inspect.signature(sender_class.__init__).parameters
        if "dest_tp_ranks" in params:
            extra = {"dest_tp_ranks": [0], "pp_rank": 0}
        for room, replica in prefill_of.items():
            mgr = managers[replica]
            sender_class(mgr=mgr, bootstrap_addr=addr, bootstrap_room=room, **extra)
            if mgr.check_status(room) == KVPoll.Failed:
                failures[room] = mgr.failure_records.get(room, "")

        # Decode: each decode replica resolves the prefill DP rank, then the connection info.
        info = requests.get(
            f"http://{addr}/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
            "&target_tp_rank=-1&target_pp_rank=-1",
            timeout=5,
        )
        info.raise_for_status()
        prefill_info = PrefillServerInfo(**info.json())
        decode_of = dict(zip(ROOMS, _dispatch(method, DP), strict=True))
        # Per decode replica, the one field of its prealloc queue the resolution reads.
        queues = {
            d: SimpleNamespace(kv_manager=SimpleNamespace(prefill_info_table={addr: prefill_info}))
            for d in range(DP)
        }
        resolved_rank = {}
        pending = defaultdict(list)
        for room, d in decode_of.items():
            rank = DecodePreallocQueue._resolve_prefill_dp_rank(queues[d], _decode_req(room, port))
            if rank is None:
                pending[d].append(room)
            else:
                resolved_rank[room] = rank
        for rooms in pending.values():
            answer = CommonKVReceiver.query_prefill_dp_ranks(addr, rooms)
            for room in rooms:
                if str(room) in answer:
                    resolved_rank[room] = int(answer[str(room)])
        receiver = SimpleNamespace(bootstrap_addr=addr)
        port_of_replica = {m.rank_port: i for i, m in enumerate(managers)}
        reached = {}
        for room, rank in resolved_rank.items():
            found = CommonKVReceiver._get_bootstrap_info_from_server(receiver, rank, 0, 0, 0)
            if found is not None:
                reached[room] = port_of_replica.get(found["rank_port"])

        ok = [r for r in ROOMS if r not in failures and reached.get(r) == prefill_of[r]]
        wrong = [r for r in ROOMS if r not in failures and reached.get(r) != prefill_of[r]]
        return {
            "resolved": len(ok),
            "conflicts": sum(CONFLICT in reason for reason in failures.values()),
            "failed": len(failures),
            "wrong_replica": len(wrong),
            "wrong_on_replica": sorted({prefill_of[r] for r in wrong + list(failures)}),
            "prefill_dp_size": prefill_info.dp_size,
        }
    finally:
        server.close()


CASES = {
    "single_replica": ([(1, 0, 1, 0, 1, 0)], ["--disaggregation-mode", "prefill"]),
    "ordinary_dp": (ORDINARY_DP_RANKS, ["--disaggregation-mode", "prefill", "--dp-size", "2"]),
    "attention_dp_two_nodes": (
        ATTENTION_DP_RANKS,
        [
            *("--disaggregation-mode", "prefill", "--tp-size", "2", "--dp-size", "2"),
            *("--enable-dp-attention", "--nnodes", "2", "--node-rank", "0"),
        ],
    ),
}


def run_variant(with_plugins: bool, model_dir: str, out: Any) -> None:
    """Spawned-process entry: every case and method, results sent back as JSON."""
    try:
        if with_plugins:
            from sglang.srt.plugins import load_plugins

            # As the harness's nodes: on the rebuilt-wheel side the allow-list names no plugin.
            os.environ[entry_point.SGLANG_PLUGINS_ENV] = nodes.plugin_allow_list()

            load_plugins()
        from sglang.srt.disaggregation.common.conn import CommonKVSender
        from sglang.srt.plugins.hook_registry import HookRegistry

        results: dict[str, Any] = {
            "sender_hooked": hasattr(CommonKVSender.__init__, "__wrapped__"),
            "sender_hooks": [
                f"{hook.__module__}.{hook.__qualname__}"
                for _type, hook, _src in HookRegistry._hooks.get(SENDER_INIT, [])
            ],
        }
        for case, (ranks, args) in CASES.items():
            for method in METHODS:
                results[f"{case}/{method}"] = _run_case(model_dir, method, ranks, args)
        out.send(json.dumps(results))
    except BaseException as exc:
        out.send(json.dumps({"error": repr(exc)}))
        raise
    finally:
        out.close()


# --- the test process --------------------------------------------------------------------------


def run_in_spawned_process(with_plugins: bool, model_dir: str) -> dict:
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=run_variant, args=(with_plugins, model_dir, sender), daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(VARIANT_DEADLINE):
            raise TimeoutError(f"variant (plugins={with_plugins}) gave no result")
        result = json.loads(receiver.recv())
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join(timeout=30)
        receiver.close()
    if "error" in result:
        raise AssertionError(f"variant (plugins={with_plugins}) failed: {result['error']}")
    return result


class TestOrdinaryDPBootstrapRank(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        model = TINY_MODEL
        cls.stock = run_in_spawned_process(False, str(model))
        cls.overlay = run_in_spawned_process(True, str(model))
        for key in cls.stock:
            if "/" in key:
                logger.info(
                    "%s: stock %d/%d, overlay %d/%d resolved to the dispatched replica",
                    key,
                    cls.stock[key]["resolved"],
                    len(ROOMS),
                    cls.overlay[key]["resolved"],
                    len(ROOMS),
                )

    def test_variants_are_stock_and_hooked(self):
        self.assertFalse(self.stock["sender_hooked"], self.stock["sender_hooks"])
        self.assertEqual(self.stock["sender_hooks"], [])
        if differences.differs(differences.ENGINE_BOOTSTRAP_RANK):
            # The plugin is not loaded on the rebuilt wheel: the engine's own sender runs.
            self.assertFalse(self.overlay["sender_hooked"], self.overlay["sender_hooks"])
            self.assertEqual(self.overlay["sender_hooks"], [])
            return
        self.assertTrue(self.overlay["sender_hooked"])
        self.assertEqual(len(self.overlay["sender_hooks"]), 1, self.overlay["sender_hooks"])
        self.assertTrue(self.overlay["sender_hooks"][0].startswith("sglang_sidecar_overlay."))

    def test_stock_reproduces_the_seed_failure_on_replica_1(self):
        for method in METHODS:
            with self.subTest(method=method):
                got = self.stock[f"ordinary_dp/{method}"]
                self.assertEqual(got["prefill_dp_size"], DP)
                if differences.differs(differences.ENGINE_BOOTSTRAP_RANK):
                    # The series' patch 0005 fixes the engine itself: nothing to reproduce.
                    self.assertEqual(got["resolved"], len(ROOMS), got)
                    continue
                self.assertEqual(got["resolved"], 20, got)
                self.assertEqual(got["wrong_on_replica"], [1], got)
                if method == "follow_bootstrap_room":
                    # Refused: "SGLang checks its attention rank0 against ... rank1".
                    self.assertEqual(got["conflicts"], 20, got)
                else:
                    # Registered as rank 0: decode fetches replica 0's connection info.
                    self.assertEqual((got["failed"], got["wrong_replica"]), (0, 20), got)

    def test_overlay_resolves_every_room_to_its_replica(self):
        for method in METHODS:
            with self.subTest(method=method):
                got = self.overlay[f"ordinary_dp/{method}"]
                self.assertEqual(got["resolved"], len(ROOMS), got)
                self.assertEqual((got["failed"], got["wrong_replica"]), (0, 0), got)

    def test_attention_dp_and_single_replica_are_unchanged(self):
        for case in ("attention_dp_two_nodes", "single_replica"):
            for method in METHODS:
                with self.subTest(case=case, method=method):
                    key = f"{case}/{method}"
                    self.assertEqual(self.overlay[key], self.stock[key])
                    self.assertEqual(self.stock[key]["resolved"], len(ROOMS), self.stock[key])


if __name__ == "__main__":
    unittest.main()
