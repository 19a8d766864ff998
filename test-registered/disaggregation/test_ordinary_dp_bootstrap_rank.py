"""Ordinary DP disaggregated (the seeds' deployment 3), scaled: a DP 2 prefill engine and a DP 2
decode engine moving real KV pages.

CPU-only. Each engine is its own host (``overlay_harness.netns``): a prefill server
(``--dp-size 2``, TP 1) and a decode server (the same), SGLang's real schedulers behind each
(``overlay_harness.group``), with SGLang's ``mooncake_tcp`` transfer backend: Mooncake's CPU
build writes every request's KV pages over TCP from the prefill's KV pool into the decode's.
What stands in for the GPU is the CPU test platform (``cpu_platform/``: the prefill sender's
host-tensor path off, all-to-all over gloo, the KV checksum computed on the CPU) and these
launch flags (``docs/compatibility.md``): ``--disaggregation-decode-retraction-backup
cpu_tensor`` on the decode (the default host pool pins memory), ``--disable-overlap-schedule``
on the prefill (its cached-prefix path records a CUDA event), no ``--nccl-port``. The PD router
is the harness's (``overlay_harness.pd.route``, run on the decode's host): the same body plus
``bootstrap_host``/``bootstrap_port``/``bootstrap_room`` to both servers, the decode's reply.

Both servers run ``--disaggregation-enable-kv-checksum``: the prefill digests the pages it sends,
the decode digests what arrived and aborts the request on a difference; the platform logs every
digest, so the test also sees that both sides computed the same one for every request. Output
tokens prove nothing (the dummy weights give uniform logits). The rooms are odd and even: under
the prefill's default ``follow_bootstrap_room`` dispatch, odd rooms go to prefill DP rank 1,
where the stock engine refuses them ("follow_bootstrap_room conflict", the seed's failure); a
second prefill launched without the plugin (``SGLANG_PLUGINS`` allow-list) reproduces that
against the same decode server. On the rebuilt wheel (``patches/``, plugin not loaded) the
engine's own sender is fixed (``patches/DIFFERENCES.md`` #5): the first launch already is the
plugin-less one, and nothing is left to reproduce.

Both engines hold the machine's large-topology gate (``overlay_harness.gate``) while they run.
"""

import collections
import importlib.util
import json
import re
import unittest

import pytest
from overlay_harness import differences, gate, kv_events, netns, nodes, pd, ports, probes
from overlay_harness.group import TINY_MODEL, EngineGroup
from overlay_harness.testcase import NodesTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import entry_point

pytestmark = pytest.mark.large_launch

register_cpu_ci(est_time=140, suite="base-a-test-cpu")

DP = 2
BACKEND = "mooncake_tcp"
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
CHECKSUM = re.compile(r"overlay CPU test platform: KV checksum (0x[0-9a-f]+) over (\d+) pages")

PD_ARGS = ["--dp-size", str(DP), "--disaggregation-transfer-backend", BACKEND,
           "--enable-metrics", "--disaggregation-enable-kv-checksum"]  # fmt: skip
PREFILL_ARGS = [*PD_ARGS, "--disaggregation-mode", "prefill", "--disable-overlap-schedule"]
DECODE_ARGS = [*PD_ARGS, "--disaggregation-mode", "decode",
               "--disaggregation-decode-retraction-backup", "cpu_tensor",
               "--disaggregation-decode-enable-radix-cache"]  # fmt: skip


def missing_piece() -> str | None:
    """What this env lacks for a real PD transfer on the CPU, or None."""
    try:
        from sglang.srt.arg_groups.choices import DISAGG_TRANSFER_BACKEND_CHOICES
    except ImportError:
        DISAGG_TRANSFER_BACKEND_CHOICES = ()
    if BACKEND not in DISAGG_TRANSFER_BACKEND_CHOICES:
        return f"this SGLang has no --disaggregation-transfer-backend {BACKEND}"
    if importlib.util.find_spec("mooncake") is None:
        return "Mooncake's CPU build (mooncake-transfer-engine-non-cuda) is not in this env"
    if importlib.util.find_spec("sglang.srt.disaggregation.checksum") is None:
        return "this SGLang has no --disaggregation-enable-kv-checksum"
    return None


MISSING = missing_piece()


def checksums(log_text: str) -> list[str]:
    """Every KV digest the CPU platform logged in a node's log, in order."""
    return [match.group(1) for match in CHECKSUM.finditer(log_text)]


def prompts(rooms: list[int]) -> list[list]:
    return [[room, kv_events.prompt(PROMPT_TOKENS)] for room in rooms]


def stored_blocks(node: nodes.Node, group: EngineGroup, rank: int) -> int:
    """``BlockStored`` events rank ``rank`` of ``node`` published, replayed from its start."""
    from sglang.srt.disaggregation.kv_events import BlockStored

    endpoint = f"tcp://127.0.0.1:{group.replay_base + rank}"
    replayed = node.inside(probes.replay, endpoint, 0, 60)
    return sum(
        isinstance(event, BlockStored)
        for _topic, _seq, payload in replayed
        for event in kv_events.decode(payload).events
    )


@unittest.skipIf(MISSING is not None, f"no real PD transfer here: {MISSING}")
class TestOrdinaryDPDisaggregation(NodesTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.started: list[nodes.Node] = []
        # Every server is stopped before the gate lets another session's large launch start.
        with gate.large_launch(cls.__name__):
            try:
                cls._run()
            finally:
                nodes.stop_all(cls.started, STOP_TIMEOUT)

    @classmethod
    def _start(cls, launch, name: str) -> nodes.Node:
        node = nodes.Node(launch, cls.workdir, name)
        cls.started.append(node)
        return node

    @classmethod
    def _ready(cls, *started: nodes.Node) -> None:
        try:
            for node in started:
                node.expect_ready()
        except BaseException:
            nodes.print_logs(list(started))
            raise

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
    def _run(cls) -> None:
        network = netns.Network(2)
        prefill_group = EngineGroup(1, [], network=network, first_host=0)
        decode_group = EngineGroup(1, [], network=network, first_host=1)
        bootstrap = ports.free_port()
        prefill = cls._start(
            prefill_group.launch(0, grpc=False, extra=[
                *PREFILL_ARGS, "--disaggregation-bootstrap-port", str(bootstrap)]),
            "prefill",
        )  # fmt: skip
        decode = cls._start(
            decode_group.launch(0, grpc=False, extra=DECODE_ARGS),
            "decode",
        )  # fmt: skip
        cls._ready(prefill, decode)
        cls.metrics_before = cls._metrics(prefill)
        cls.replies = cls._route(prefill, decode, bootstrap, ROOMS)
        cls.metrics_after = cls._metrics(prefill)
        cls.prefill_blocks = [stored_blocks(prefill, prefill_group, r) for r in range(DP)]
        cls.decode_blocks = [stored_blocks(decode, decode_group, r) for r in range(DP)]
        cls.prefill_log = prefill.log_text()
        cls.decode_log = decode.log_text()
        cls.stock_replies = cls.stock_log = None
        if differences.differs(differences.ENGINE_BOOTSTRAP_RANK):
            return
        # The stock engine: a second prefill without the plugin, against the same decode.
        prefill.stop(STOP_TIMEOUT)
        cls.started.remove(prefill)
        stock_group = EngineGroup(1, [], network=network, first_host=0)
        stock_bootstrap = ports.free_port()
        stock = cls._start(
            stock_group.launch(0, grpc=False, extra=[
                *PREFILL_ARGS, "--disaggregation-bootstrap-port", str(stock_bootstrap)],
                env={entry_point.SGLANG_PLUGINS_ENV: NO_PLUGIN}),
            "stock-prefill",
        )  # fmt: skip
        cls._ready(stock)
        cls.stock_replies = cls._route(stock, decode, stock_bootstrap, STOCK_ROOMS)
        cls.stock_log = stock.log_text()

    def test_every_request_succeeds_on_both_prefill_ranks(self):
        self.assertEqual(len(self.replies), len(ROOMS))
        for reply in self.replies:
            with self.subTest(room=reply["room"]):
                self.assertFalse(pd.failed(reply["prefill"]), reply["prefill"])
                self.assertFalse(pd.failed(reply["decode"]), reply["decode"])
                self.assertEqual(reply["decode"]["meta_info"]["completion_tokens"], NEW_TOKENS)
        self.assertEqual({room % DP for room in ROOMS}, set(range(DP)))
        # Each prefill rank's radix cache stored its requests' prompts: both ranks were used.
        for rank, blocks in enumerate(self.prefill_blocks):
            self.assertGreater(blocks, 0, f"no BlockStored from prefill DP rank {rank}")

    def test_checksums_agree_on_both_sides(self):
        sent = collections.Counter(checksums(self.prefill_log))
        received = checksums(self.decode_log)
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

    def test_both_sides_publish_block_stored(self):
        print(
            f"BlockStored per DP rank: prefill {self.prefill_blocks}, decode {self.decode_blocks}"
        )
        self.assertGreater(sum(self.prefill_blocks), 0)
        for rank, blocks in enumerate(self.decode_blocks):
            self.assertGreater(blocks, 0, f"no BlockStored from decode DP rank {rank}")

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
