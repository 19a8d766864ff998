"""Ordinary DP disaggregated (the seeds' deployment 3), scaled: a DP 2 prefill engine and a DP 2
decode engine moving real KV pages, behind Dynamo's OpenAI frontend.

CPU-only. Each engine is its own host (``overlay_harness.netns``): a prefill server
(``--dp-size 2``, TP 1) and a decode server (the same), SGLang's real schedulers behind each
(``overlay_harness.group``), with SGLang's ``mooncake_tcp`` transfer backend: Mooncake's CPU
build writes every request's KV pages over TCP from the prefill's KV pool into the decode's.
What stands in for the GPU is the CPU test platform (``cpu_platform/``: the prefill sender's
host-tensor path off, all-to-all over gloo, the KV checksum computed on the CPU) and these
launch flags (``docs/compatibility.md``): ``--disaggregation-decode-retraction-backup
cpu_tensor`` on the decode (the default host pool pins memory), ``--disable-overlap-schedule``
on the prefill (its cached-prefix path records a CUDA event), no ``--nccl-port``. The seed's
shape is two engines of each kind on four nodes; one of each is what this machine holds beside
the other sessions (``docs/validation.md``).

Each engine runs Dynamo 1.6.1's sidecar under the overlay's supervisor, in the engine's
disaggregation mode: the prefill's registers on Dynamo's prefill endpoint, the decode's on the
backend endpoint. Dynamo's frontend (KV router mode) and two standalone routers (one per kind,
the oracle of what the events told a router) run on the decode's host.

Both servers run ``--disaggregation-enable-kv-checksum``: the prefill digests the pages it sends,
the decode digests what arrived and aborts the request on a difference; the platform logs every
digest, so the test also sees that both sides computed the same one for every request. Output
tokens prove nothing (the dummy weights give uniform logits). In order:

1. the harness's own PD router (``overlay_harness.pd.route``) sends 12 requests with bootstrap
   rooms both odd and even: under the prefill's default ``follow_bootstrap_room`` dispatch odd
   rooms go to prefill DP rank 1, where the stock engine refuses them ("follow_bootstrap_room
   conflict", the seed's failure). Every request succeeds, the checksums agree, and the
   prefill's transferred bytes are every prompt token's KV;
2. the seed's measurements through Dynamo's frontend (``overlay_harness.seed_checks``): the
   routers know the two prefill and two decode targets; each (prefill, decode) pair pinned
   in turn (the 40-request benchmark is ``make validate``'s), with the prefill's cache found by the
   unpinned repeats (36 requests, 28 unpinned); every target's events seen by its router; the
   checksums agree for every request;
3. a second prefill launched without the plugin (``SGLANG_PLUGINS`` allow-list) refuses every
   odd room against the same decode server. On the rebuilt wheel (``patches/``, plugin not
   loaded) the engine's own sender is fixed (``patches/DIFFERENCES.md`` #5): the first launch
   already is the plugin-less one, and nothing is left to reproduce.

Both engines hold the machine's large-topology gate (``overlay_harness.gate``) while they run.
"""

import collections
import contextlib
import json
import unittest

import pytest
from overlay_harness import (
    differences,
    dynamo,
    gate,
    kv_events,
    netns,
    nodes,
    pd,
    ports,
    probes,
    seed_checks,
)
from overlay_harness.group import PAGE_SIZE, TINY_MODEL, EngineGroup
from overlay_harness.testcase import DeploymentTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import entry_point

pytestmark = pytest.mark.large_launch

register_cpu_ci(est_time=240, suite="base-a-test-cpu")

DP = 2
PROMPT_TOKENS = 80  # five whole pages: every prompt token's KV is transferred
NEW_TOKENS = 4
FIRST_ROOM = 7_340_000_000
# Rooms both odd and even, so both prefill DP ranks serve requests.
ROOMS = [FIRST_ROOM + i for i in range(12)]
STOCK_ROOMS = [FIRST_ROOM + 100 + i for i in range(4)]
REQUEST_DEADLINE = 300.0
# How long a server gets for an orderly stop before it is killed: not what is tested here,
# and the decode still holds the stock prefill's refused requests.
STOP_TIMEOUT = 10.0
CONFLICT = "follow_bootstrap_room conflict"
NO_PLUGIN = "none"
PD_ARGS = ["--dp-size", str(DP), *pd.TRANSFER_ARGS, "--enable-metrics"]
PREFILL_ARGS = [*PD_ARGS, *pd.PREFILL_ARGS]
DECODE_ARGS = [*PD_ARGS, *pd.DECODE_ARGS]
MISSING = pd.missing_piece()


def prompts(rooms: list[int]) -> list[list]:
    return [[room, kv_events.prompt(PROMPT_TOKENS)] for room in rooms]


@unittest.skipIf(MISSING is not None, f"no real PD transfer here: {MISSING}")
class TestOrdinaryDPDisaggregation(DeploymentTestCase):
    @classmethod
    def start(cls, stack: contextlib.ExitStack) -> None:
        # Every server is stopped before the gate lets another session's large launch start.
        stack.enter_context(gate.large_launch(cls.__name__))
        stack.callback(nodes.stop_all, cls.started, STOP_TIMEOUT)
        tokenizer_args = dynamo.enter_consumer(stack, cls.workdir)
        network = netns.Network(2)
        prefill_group = EngineGroup(1, [], network=network, first_host=0)
        decode_group = EngineGroup(1, [], network=network, first_host=1)
        # The oracle routers start before the workers register: a standalone router that
        # finds a decode worker's card at its start skips KV events (1.6.1's decode routing
        # does not score overlap), one started first subscribes to every worker's events.
        network.acquire()
        stack.callback(network.release)
        routers = dynamo.PrefillDecodeRouters(decode_group.host(0), PAGE_SIZE, cls.workdir)
        stack.callback(routers.stop)
        bootstrap = ports.free_port()
        prefill = cls._start(prefill_group, "prefill", [
            *PREFILL_ARGS, "--disaggregation-bootstrap-port", str(bootstrap),
            *dynamo.LEADER_ARGS, *tokenizer_args], mode="prefill")  # fmt: skip
        decode = cls._start(decode_group, "decode", [
            *DECODE_ARGS, *dynamo.LEADER_ARGS, *tokenizer_args], mode="decode")  # fmt: skip
        for node in (prefill, decode):
            node.expect_ready()
        frontend = dynamo.Frontend(decode.host, decode.address, cls.workdir / "home",
                                   cls.workdir / "frontend.log")  # fmt: skip
        stack.callback(frontend.stop)
        cls._route_rooms(prefill, decode, bootstrap)
        cls._measure_through_dynamo(prefill, decode, frontend, routers)
        cls.stock_replies = cls.stock_log = None
        if differences.differs(differences.ENGINE_BOOTSTRAP_RANK):
            return
        # The stock engine: a second prefill without the plugin, against the same decode.
        prefill.stop(STOP_TIMEOUT)
        cls.started.remove(prefill)
        stock_group = EngineGroup(1, [], network=network, first_host=0)
        stock_bootstrap = ports.free_port()
        stock = cls._start(stock_group, "stock-prefill", [
            *PREFILL_ARGS, "--disaggregation-bootstrap-port", str(stock_bootstrap)],
            mode=None, env={entry_point.SGLANG_PLUGINS_ENV: NO_PLUGIN})  # fmt: skip
        stock.expect_ready()
        cls.stock_replies = cls._route(stock, decode, stock_bootstrap, STOCK_ROOMS)
        cls.stock_log = stock.log_text()

    @classmethod
    def _start(cls, group: EngineGroup, name: str, extra: list[str], *, mode: str | None,
               env: dict | None = None) -> nodes.Node:  # fmt: skip
        """The group's engine, with Dynamo's sidecar in disaggregation ``mode`` if given."""
        consumer = {}
        if mode is not None:
            endpoint = group.grpc_endpoint(0)
            consumer = {"sidecar": dynamo.DYNAMO, "sidecar_args": dynamo.sidecar_args(
                follower=False, endpoint=endpoint, mode=mode)}  # fmt: skip
        launch = group.launch(0, grpc=mode is not None, extra=extra, env=env, **consumer)
        node = nodes.Node(launch, cls.workdir, name)
        cls.started.append(node)
        return node

    @classmethod
    def _route(cls, prefill: nodes.Node, decode: nodes.Node, bootstrap: int, rooms: list[int]):
        return decode.inside(
            pd.route,
            [prefill.address, prefill.http_port],
            [decode.address, decode.http_port],
            bootstrap,
            prompts(rooms),
            NEW_TOKENS,
            REQUEST_DEADLINE,
        )

    @classmethod
    def _metrics(cls, prefill: nodes.Node) -> tuple[int, int]:
        status, text = prefill.inside(probes.http_text, prefill.http_port, prefill.address,
                                      "/metrics")  # fmt: skip
        assert status == 200, (status, text[:500])
        return pd.transferred_bytes(text)

    @classmethod
    def _route_rooms(cls, prefill: nodes.Node, decode: nodes.Node, bootstrap: int) -> None:
        """Phase 1: the harness's PD router, rooms odd and even."""
        cls.metrics_before = cls._metrics(prefill)
        cls.replies = cls._route(prefill, decode, bootstrap, ROOMS)
        cls.metrics_after = cls._metrics(prefill)
        cls.prefill_log, cls.decode_log = prefill.log_text(), decode.log_text()

    @classmethod
    def _measure_through_dynamo(cls, prefill: nodes.Node, decode: nodes.Node,
                                frontend: dynamo.Frontend, routers) -> None:  # fmt: skip
        """Phase 2: the seed's measurements through Dynamo's frontend, and the checksums of
        every request it sent."""
        sent_before, received_before = len(pd.checksums(prefill.log_text())), len(
            pd.checksums(decode.log_text()))  # fmt: skip
        metrics_before = cls._metrics(prefill)
        cls.measured, *cls.dynamo_targets = seed_checks.measure_disaggregated(
            "3. ordinary DP disaggregate, 1 prefill + 1 decode engine on 2 nodes",
            frontend, routers, DP,
        )  # fmt: skip
        metrics_after = cls._metrics(prefill)
        cls.dynamo_transfers = [after - before for after, before in
                                zip(metrics_after, metrics_before, strict=True)]  # fmt: skip
        prefill_log, cls.dynamo_decode_log = prefill.log_text(), decode.log_text()
        cls.dynamo_sent = list(zip(pd.checksums(prefill_log), pd.page_counts(prefill_log),
                                   strict=True))[sent_before:]  # fmt: skip
        cls.dynamo_received = pd.checksums(cls.dynamo_decode_log)[received_before:]

    def test_every_request_succeeds_on_both_prefill_ranks(self):
        self.assertEqual(len(self.replies), len(ROOMS))
        for reply in self.replies:
            with self.subTest(room=reply["room"]):
                self.assertFalse(pd.failed(reply["prefill"]), reply["prefill"])
                self.assertFalse(pd.failed(reply["decode"]), reply["decode"])
                self.assertEqual(reply["decode"]["meta_info"]["completion_tokens"], NEW_TOKENS)
        self.assertEqual({room % DP for room in ROOMS}, set(range(DP)))

    def test_checksums_agree_on_both_sides(self):
        sent = collections.Counter(pd.checksums(self.prefill_log))
        received = pd.checksums(self.decode_log)
        # The decode verifies every routed request once (the prefill also digests its warm-up).
        self.assertEqual(len(received), len(ROOMS), received)
        self.assertEqual(len(set(received)), len(ROOMS), received)
        for digest in received:
            self.assertGreaterEqual(sent[digest], 1, f"decode digest {digest} never sent")
        self.assertNotIn("KV checksum mismatch", self.decode_log)
        print(f"{len(received)} decode digests, each sent by the prefill: {received}")

    def test_transferred_bytes_are_every_prompt_token(self):
        config = json.loads((TINY_MODEL / "config.json").read_text())
        per_token = pd.kv_bytes_per_token(config)
        sent_bytes = self.metrics_after[0] - self.metrics_before[0]
        transfers = self.metrics_after[1] - self.metrics_before[1]
        print(f"prefill sent {sent_bytes} B in {transfers} transfers ({per_token} B per token)")
        self.assertEqual(transfers, len(ROOMS))
        self.assertEqual(sent_bytes, len(ROOMS) * PROMPT_TOKENS * per_token)

    def test_the_seed_measurements_through_dynamos_frontend(self):
        prefill_targets, decode_targets = self.dynamo_targets
        self.assertEqual(sorted(rank for _worker, rank in prefill_targets), list(range(DP)))
        self.assertEqual(sorted(rank for _worker, rank in decode_targets), list(range(DP)))
        self.assert_seed_pass(self.measured)

    def test_checksums_agree_for_every_request_through_dynamo(self):
        bench, targeted = self.measured.benchmark, self.measured.targeted
        # The probe, the targeted requests and, where it ran, the benchmark's two passes.
        requests = 1 + targeted.requests + (2 * bench.requests if bench else 0)
        # The prefill digests the pages it sends for every request (none when the decode's
        # own cache held the prompt); the decode verifies each digest against what arrived.
        self.assertEqual(len(self.dynamo_sent), requests, self.dynamo_sent)
        sent = collections.Counter(digest for digest, _pages in self.dynamo_sent)
        self.assertEqual(collections.Counter(self.dynamo_received), sent)
        self.assertNotIn("KV checksum mismatch", self.dynamo_decode_log)
        spared = sum(1 for _digest, pages in self.dynamo_sent if not pages)
        print(f"{requests} requests through Dynamo, each digest verified by the decode "
              f"({spared} over 0 pages: the decode's cache held the prompt)")  # fmt: skip

    def test_transferred_bytes_through_dynamo_are_the_digested_pages(self):
        config = json.loads((TINY_MODEL / "config.json").read_text())
        page_bytes = PAGE_SIZE * pd.kv_bytes_per_token(config)
        sent_bytes, transfers = self.dynamo_transfers
        pages = sum(pages for _digest, pages in self.dynamo_sent)
        print(f"through Dynamo the prefill sent {sent_bytes} B in {transfers} transfers; it "
              f"digested {pages} pages of {page_bytes} B")  # fmt: skip
        self.assertEqual(transfers, len(self.dynamo_sent))
        self.assertEqual(sent_bytes % page_bytes, 0)
        if pd.digests_only_sent_pages():
            self.assertEqual(sent_bytes, pages * page_bytes)
        else:
            # Whole prompts digested: what a decode's cached prefix spared is not in them.
            self.assertLessEqual(sent_bytes, pages * page_bytes)

    def test_stock_prefill_refuses_odd_rooms(self):
        self.assertNotIn(CONFLICT, self.prefill_log)
        if differences.differs(differences.ENGINE_BOOTSTRAP_RANK):
            # The plugin is not loaded on the rebuilt wheel: the first launch was the engine's
            # own sender, fixed by the series, and served every odd room above.
            self.assertTrue(all(not pd.failed(r["decode"]) for r in self.replies if r["room"] % 2))
            return
        for reply in self.stock_replies:
            with self.subTest(room=reply["room"]):
                if reply["room"] % DP == 0:
                    self.assertFalse(pd.failed(reply["decode"]), reply)
                else:
                    self.assertTrue(pd.failed(reply["prefill"]), reply)
        # Refused by the stock sender on prefill DP rank 1, which checks its attention-DP rank.
        for room in STOCK_ROOMS:
            refused = f"{CONFLICT}: dispatched to dp_rank 0 but bootstrap_room {room} " in (
                self.stock_log
            )
            self.assertEqual(refused, room % DP == 1, room)


if __name__ == "__main__":
    unittest.main()
