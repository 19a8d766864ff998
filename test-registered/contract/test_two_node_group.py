"""One two-node attention-DP group on real inference, read by everything that consumes the
contract, with NVIDIA Dynamo's released sidecar on every node and Dynamo's router as the oracle.

CPU-only: SGLang's real schedulers on the CPU test platform (``cpu_platform/``), the tiny
config-only model with dummy weights, ``--tp 2 --dp 2 --enable-dp-attention`` over two nodes
(rank 0 on the leader, rank 1 on the follower), a real gloo rendezvous across the test's
bridge (each node is its own host, ``overlay_harness.netns``), real requests through the
leader's HTTP server, the real radix cache and each rank's real ``ZmqEventPublisher`` (page
size 16, with a replay ROUTER). Nothing stands in for a GPU but the platform.

Each node runs ``--sidecar dynamo.sglang.sidecar`` (ai-dynamo 1.6.1) under the overlay's
supervisor: leader mode on node 0 (it registers ``dynamo.backend.generate``), relay mode on
node 1 (``--sidecar-on-followers``: it relays rank 1's events under the leader's worker).
The ``dp_size`` switch is not set: the overlay turns it on for this consumer by itself.
Dynamo's OpenAI frontend (``python -m dynamo.frontend --router-mode kv``), where users'
requests enter, and its standalone router (``python -m dynamo.router``), the oracle of what
the events told a router, run on the leader's host, with file discovery, TCP requests and ZMQ
events: no etcd, no NATS.

In order (the last one takes the group down):
1. each node lists its own rank's source; each advertised loopback endpoint delivers a live
   batch of a real request on its own node and refuses a connection from the other node;
2. per rank, a prompt pinned to it (``routed_dp_rank``) is stored by that rank: its
   ``BlockStored`` events, received on the rank's node through the advertised endpoint, carry
   the rank, the advertised block size and the prompt's pages; a replay from a sequence number
   returns the same batches, byte for byte;
3. ``sglang-sidecar-overlay probe --listen`` and ``--watch`` on the follower see those events;
4. ``probe --group`` on the leader's host passes, and names the follower when it is left out;
5. the seed's measurements through Dynamo's OpenAI frontend (``dynamo.frontend``, KV router
   mode, on the leader's host; the tokenizer its model card needs is built at test time,
   ``overlay_harness.tokenizer``) with the router as the oracle (``overlay_harness.seed_checks``):
   40 requests of 128 tokens in and 64 out, 4 at a time, all served; per rank, two requests
   pinned to it and seven unpinned repeats, each routed to the rank that holds its prefix and
   served from its cache (rank 1's on the follower node); each rank's pinned prompt scored on
   that rank and no other (its ``BlockStored`` events reached the router);
6. the next Dynamo release (1.7, from an env of its own) beside the supervised 1.6.1 sidecars,
   on the same launch and with the switch still unset: its sidecar on both nodes and its
   router register exactly ranks 0 and 1, see each rank's pinned prompt on that rank, route
   an unpinned repeat to the rank that holds it and fresh prompts to ranks that exist; the
   shape the switch served before it reported ``attn_dp_size`` 1 (``dp_size`` 2 beside
   ``attn_dp_size`` 2) makes that version's relay refuse the follower;
7. the switch's default for this consumer: each node logs it once and reports ``dp_size`` 2
   (and ``attn_dp_size`` 1 where the release reports it);
8. the fault table's row a (``overlay_harness.fault_rows``, ``docs/faults.md``): the
   follower's relay SIGKILLed under a steady load through the frontend, with ``--sidecar-restart
   on-failure``: no request fails or hangs, the relay is back within 5 s, and a prompt pinned
   to rank 1 after the restart is scored there, its unpinned repeats routed to rank 1;
9. a scheduler that raises (a request with token ids beyond the vocabulary, pinned to rank 1:
   SGLang's SIGQUIT path) while the follower's metadata server and sidecar run: the follower's
   health turns NOT_SERVING, its sidecar goes with it, the router drops rank 1, and
   ``probe --group`` names the follower.
"""

import contextlib
import json
import re
import subprocess
import sys
import time
import unittest

from overlay_harness import (
    deployments,
    differences,
    dynamo,
    fault_rows,
    kv_events,
    nodes,
    probes,
    seed_checks,
)
from overlay_harness.checks import NodeInfoChecks, report_launch
from overlay_harness.group import PAGE_SIZE, EngineGroup
from overlay_harness.testcase import DeploymentTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=180, suite="base-a-test-cpu")

RELEASE = releases.installed_sglang_version() or ""
REPLAY_HAS_TOPIC = releases.adapter_for(RELEASE or "0") == "sglang_sidecar_overlay.adapters.v0_5_22"
ATTENTION_DP = ["--tp", "2", "--dp", "2", "--enable-dp-attention"]
REPLAY_DEADLINE = 60.0
GONE_DEADLINE = 120.0
SWITCH_DEFAULT_LOG = "SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE not set: on for --sidecar"
# Token ids the tiny model's vocabulary (512) does not have.
OUT_OF_VOCABULARY = [600 + i for i in range(32)]
NEW_TOKENS = 4
PROBE_WINDOW = 15
PROBE_REQUESTS = 60
FRESH_PROMPTS = 2
# Dynamo >= 1.7's relay, given a follower whose dp_size * attn_dp_size differs from what its
# leader registered.
REGISTRATION_MISMATCH = "does not match leader registration"


def overlay_cli(on: nodes.Node, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The installed ``sglang-sidecar-overlay`` CLI, run on ``on``'s host, no terminal."""
    command = [sys.executable, "-m", "sglang_sidecar_overlay", *args]
    return subprocess.run(
        on.command(command), capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def probe_group(on: nodes.Node, *targets: str) -> tuple[int, dict, str]:
    """``probe --group`` on ``on``'s host (JSON and human output); (exit code, JSON, text)."""
    as_json = overlay_cli(on, "probe", "--group", *targets, "--json")
    text = overlay_cli(on, "probe", "--group", *targets)
    assert as_json.returncode == text.returncode, (as_json.stdout, text.stdout)
    return as_json.returncode, json.loads(as_json.stdout), text.stdout


def group_errors(report: dict) -> dict:
    return {c["field"]: c["message"] for c in report["checks"] if c["level"] == "error"}


class TestTwoNodeGroup(DeploymentTestCase, NodeInfoChecks):
    @classmethod
    def start(cls, stack: contextlib.ExitStack) -> None:
        cls.group = EngineGroup(2, ATTENTION_DP)
        tokenizer_args = dynamo.enter_consumer(stack, cls.workdir)
        follower = cls.group.launch(
            1,
            sidecar=dynamo.DYNAMO,
            sidecar_args=[
                "--sidecar-restart",
                "on-failure",
                *dynamo.sidecar_args(follower=True, endpoint=cls.group.grpc_endpoint(1)),
            ],
            extra=tokenizer_args,
        )
        leader = cls.group.launch(
            0,
            sidecar=dynamo.DYNAMO,
            sidecar_args=dynamo.sidecar_args(follower=False, endpoint=cls.group.grpc_endpoint(0)),
            extra=[*dynamo.LEADER_ARGS, *tokenizer_args],
        )
        # Follower first: it waits for its leader in the rendezvous, as in production.
        began = time.monotonic()
        # The follower runs SGLang's blocking follower branch, as launch_server does in
        # production: how the node ends when its scheduler raises is part of the test.
        cls.started = stack.enter_context(
            nodes.running(follower, leader, names=["follower", "leader"],
                          roles=["blocking-follower", None], log_dir=cls.workdir)
        )  # fmt: skip
        cls.follower, cls.leader = cls.started
        cls.leader.expect_ready()
        cls.follower.wait_serving()
        report_launch(
            "two nodes, TP 2 / attention DP 2, Dynamo sidecars", [cls.leader, cls.follower], began
        )
        cls.nodes = [cls.leader, cls.follower]
        cls.infos = [node.server_info() for node in cls.nodes]
        cls.router = dynamo.Router(cls.leader.host, PAGE_SIZE, cls.workdir / "router.log")
        stack.callback(cls.router.stop)
        cls.frontend = dynamo.Frontend(
            cls.leader.host, cls.leader.address, cls.workdir / "home", cls.workdir / "frontend.log"
        )
        stack.callback(cls.frontend.stop)
        cls.deployment = deployments.Deployment(cls.nodes, "", cls.frontend, cls.router, 2)

    def target(self, node_rank: int) -> str:
        return f"{self.group.address(node_rank)}:{self.group.grpc_ports[node_rank]}"

    def source(self, rank: int) -> tuple[nodes.Node, dict]:
        """The node that owns publisher rank ``rank``, and its advertised source."""
        for node, info in zip(self.nodes, self.infos, strict=True):
            for source in info["kv_event_sources"]:
                if source["dp_rank"] == rank:
                    return node, source
        raise AssertionError(f"no node advertises rank {rank}")

    def test_1_each_node_lists_its_own_source_reachable_only_there(self):
        for node_rank, info in enumerate(self.infos):
            self.assert_node_info(info, self.group, node_rank, [node_rank])
            self.assertEqual(info["kv_event_rank_space"]["size"], 2)
        self.assert_group_sources(self.nodes, self.infos)

    def test_2_real_events_per_rank_through_the_advertised_endpoints(self):
        for rank in (0, 1):
            owner, source = self.source(rank)
            prompt = kv_events.prompt()
            wanted = kv_events.stored_prompt_pages(prompt, NEW_TOKENS)
            received: list = []
            with owner.stream(probes.kv_batches, source["endpoint"], source["topic"], 120) as live:
                self.assertEqual(live.next_item(timeout=60), "subscribed")
                self.leader.generate(prompt, NEW_TOKENS, rank)
                stored: list = []
                while not all(page in stored for page in wanted):
                    received.append(live.next_item(timeout=60))
                    stored += [
                        t for t, _ in kv_events.stored_pages([kv_events.decode(received[-1][1])])
                    ]
            batches = [kv_events.decode(payload) for _seq, payload in received]
            pages = kv_events.stored_pages(batches)
            self.assertTrue(all(b.attn_dp_rank == rank for b in batches), batches)
            self.assertEqual({size for _tokens, size in pages}, {source["block_size"]})
            self.assertEqual([t for t, _ in pages if t in wanted], wanted, f"rank {rank}")
            # A consumer that missed them asks the replay ROUTER from the first one's number.
            first = received[0][0]
            replayed = owner.inside(
                probes.replay, source["replay_endpoint"], first, REPLAY_DEADLINE
            )
            by_seq = {seq: payload for _topic, seq, payload in replayed}
            for seq, payload in received:
                self.assertEqual(by_seq.get(seq), payload, f"rank {rank}: seq {seq} replayed")
            topics = {topic for topic, _seq, _payload in replayed}
            # 0.5.22+ replay each batch with its topic frame, earlier releases without one.
            self.assertEqual(topics, {source["topic"]} if REPLAY_HAS_TOPIC else {None})
            sys.stderr.write(
                f"[{RELEASE}] rank {rank} on {owner.name}: {len(received)} live batch(es) "
                f"(seq {[s for s, _ in received]}), {len(pages)} page(s) stored, block size "
                f"{source['block_size']}; replay from {first}: {len(replayed)} batch(es)\n"
            )

    def test_3_probe_listen_and_watch_see_real_events_on_the_follower(self):
        checks = {
            "--listen": r"rank 1 .* [1-9]\d* batches / [1-9]\d* events live",
            "--watch": r"node_rank=1 rank=1 .*last_seq=\d+ gaps=0",
        }
        for mode, expected in checks.items():
            argv = [sys.executable, "-m", "sglang_sidecar_overlay", "probe", self.target(1),
                    mode, str(PROBE_WINDOW)]  # fmt: skip
            with subprocess.Popen(
                self.follower.command(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, stdin=subprocess.DEVNULL,
            ) as probe:  # fmt: skip
                try:
                    # Rank 1 stores new pages for as long as the probe listens.
                    for _ in range(PROBE_REQUESTS):
                        if probe.poll() is not None:
                            break
                        self.leader.generate(kv_events.prompt(), 1, 1)
                    output, _ = probe.communicate(timeout=120)
                finally:
                    probe.kill()
            sys.stderr.write(f"[{RELEASE}] probe {mode} {PROBE_WINDOW}:\n{output}\n")
            self.assertEqual(probe.returncode, 0, output)
            self.assertRegex(output, expected)

    def test_4_group_probe_from_the_leaders_host(self):
        leader, follower = self.target(0), self.target(1)
        code, report, text = probe_group(self.leader, follower, leader)
        self.assertEqual(code, 0, text)
        self.assertTrue(report["ok"], text)
        self.assertEqual(
            report["ranks"],
            {
                "0": [{"node_rank": 0, "target": leader}],
                "1": [{"node_rank": 1, "target": follower}],
            },
        )
        health = "absent" if differences.differs(differences.FOLLOWER_HEALTH) else "SERVING"
        self.assertIn(f"node_rank 1  {follower}  ranks 1  health {health}", text)
        print(f"--- probe --group {follower} {leader}\n{text}", file=sys.stderr)

        code, report, text = probe_group(self.leader, leader)
        self.assertEqual(code, 1, text)
        errors = group_errors(report)
        self.assertEqual(
            errors["rank 1"],
            "no node advertises it; expected on node_rank 1 (not given): is its publisher missing?",
        )
        self.assertIn("nnodes=2 but 1 address(es) were given", errors["nnodes"])

    def test_5_the_seed_measurements_through_dynamos_frontend(self):
        targets = seed_checks.registered_targets(self.router, 2)
        self.assertEqual([rank for _worker, rank in targets], [0, 1])
        self.frontend.wait_for_model()
        measured = seed_checks.measure("2. attention DP aggregate, 2 nodes", self.frontend,
                                       self.router, targets, with_benchmark=True)  # fmt: skip
        self.assert_seed_pass(measured)
        # Rank 1's prefills ran on the follower node, from its cache.
        cached = f"#cached-token: {kv_events.reused_tokens([0] * seed_checks.INPUT_TOKENS)}"
        self.assertTrue(
            any(
                "TP1]" in line and cached in line for line in self.follower.log_text().splitlines()
            ),
            f"no '{cached}' prefill logged by rank 1 on the follower",
        )

    def test_6_the_next_dynamo_registers_every_rank_with_no_switch_set(self):
        nodes = [(node.host, self.target(node_rank)) for node_rank, node in enumerate(self.nodes)]
        for version in dynamo.next_consumers():
            began = time.monotonic()
            with dynamo.ConsumerSet(
                dynamo.consumer(version), nodes, PAGE_SIZE, self.workdir
            ) as consumer:
                registered = consumer.router.registered_ranks(kv_events.prompt())
                self.assertEqual(registered, {0, 1}, f"ai-dynamo {version}")
                scores, routed = self._route_through(consumer.router, version)
                fresh = [consumer.router.generate(kv_events.prompt(), 1) for _ in
                         range(FRESH_PROMPTS)]  # fmt: skip
                self.assertTrue(all(r["prefill_dp_rank"] in (0, 1) for r in fresh), fresh)
                self.assertEqual(consumer.exited(), [], f"ai-dynamo {version}")
                refused = self._old_switch_shape_refused(consumer)
            sys.stderr.write(
                f"[{RELEASE}] ai-dynamo {version}: registered ranks {sorted(registered)}; "
                f"overlap after each pinned prompt {scores}; unpinned repeats {routed}; "
                f"fresh prompts on ranks {[r['prefill_dp_rank'] for r in fresh]}; old switch "
                f"shape: {refused!r}; {time.monotonic() - began:.0f} s\n"
            )

    def _route_through(self, router: dynamo.Router, version: str) -> tuple[dict, dict]:
        """A prompt pinned to each rank shows on that rank only; its unpinned repeat goes
        there and is served from that rank's cache."""
        on_rank = {1: kv_events.prompt(), 0: kv_events.prompt()}
        pages = len(kv_events.stored_prompt_pages(on_rank[1], NEW_TOKENS))
        scores = {}
        for rank, prompt in on_rank.items():
            self.leader.generate(prompt, NEW_TOKENS, rank)
            scores[rank] = nodes.wait_for(
                lambda p=prompt, r=rank: (s := router.overlap(p))[r] == pages and s,
                dynamo.ROUTER_DEADLINE,
                f"ai-dynamo {version}'s router to see the prompt's {pages} pages on rank {rank}",
            )
            self.assertEqual(scores[rank], {rank: pages, 1 - rank: 0}, version)
        routed = {rank: router.generate(p, NEW_TOKENS) for rank, p in on_rank.items()}
        for rank, result in routed.items():
            self.assertEqual(result["prefill_dp_rank"], rank, (version, result))
            self.assertEqual(result["cached_tokens"], kv_events.reused_tokens(on_rank[rank]))
        return scores, routed

    def _old_switch_shape_refused(self, consumer: dynamo.ConsumerSet) -> str:
        """The follower's real reply in the shape the switch served before (``dp_size`` raised,
        ``attn_dp_size`` kept), served on the follower's host: ``consumer``'s relay, whose
        leader registered the launch's real widths, refuses it. Its log line."""
        old = dict(self.infos[1], attn_dp_size=self.infos[1]["kv_event_rank_space"]["attn_dp_size"])
        address = self.group.address(1)
        with self.follower.stream(probes.serve_reply, json.dumps(old), address) as served:
            port = served.next_item(timeout=60)
            relay = consumer.sidecar(self.follower.host, f"{address}:{port}", "old-shape")
            consumer.sidecars.append(relay)
            try:
                relay.proc.wait(timeout=dynamo.ROUTER_DEADLINE)
            except subprocess.TimeoutExpired:
                self.fail(f"the relay accepted {old['dp_size']} x {old['attn_dp_size']} ranks")
        log = relay.log_text()
        self.assertNotEqual(relay.proc.returncode, 0, log[-2000:])
        self.assertIn(REGISTRATION_MISMATCH, log)
        return next(line for line in log.splitlines() if REGISTRATION_MISMATCH in line)[-300:]

    def test_7_the_switch_defaults_on_for_this_consumer(self):
        for node, info in zip(self.nodes, self.infos, strict=True):
            self.assertEqual(info["dp_size"], 2, node.name)
            self.assertEqual(info.get("attn_dp_size", 1), 1, node.name)
            if differences.differs(differences.DYNAMO_SWITCH_DEFAULT):
                continue  # set explicitly there (overlay_harness.dynamo.consumer_environ)
            self.assertEqual(node.log_text().count(SWITCH_DEFAULT_LOG), 1, node.log_tail())

    @unittest.skipUnless(
        seed_checks.benchmark_asserted_here(),
        "the fault table's rows run in make test on the newest release with the plugin; "
        "make faults runs them on every column",
    )
    def test_8_a_killed_relay_restarts_under_load_with_no_failed_request(self):
        self.assert_fault_row(
            fault_rows.follower_relay_killed(self.deployment, "overlay", restarts=True)
        )

    def test_9_a_raising_follower_scheduler_takes_its_sidecar_and_rank_away(self):
        prompt = kv_events.prompt()
        self.assertEqual(set(self.router.wait_for_ranks({0, 1}, prompt)), {0, 1})
        sidecar = fault_rows.sidecar_pids(self.follower)
        self.assertTrue(sidecar, "the follower's sidecar is not running")
        watch = None
        if not differences.differs(differences.FOLLOWER_HEALTH):
            watch = self.follower.watch_health()
            self.assertEqual(watch.first_status(), nodes.SERVING)
        try:
            with contextlib.suppress(AssertionError):  # the request dies with its rank
                self.leader.generate(OUT_OF_VOCABULARY, 1, 1, seconds=10)
            if watch is not None:
                self.assertEqual(watch.statuses_until(nodes.NOT_SERVING)[-1], nodes.NOT_SERVING)
        finally:
            if watch is not None:
                watch.close()
        self.follower.proc.wait(timeout=GONE_DEADLINE)
        self.assertNotEqual(self.follower.proc.returncode, 0)
        log = self.follower.log_text()
        self.assertIn("Scheduler hit an exception", log)
        crash = log.index("Scheduler hit an exception")
        # The sidecar was told, before the node went: by the stop ahead of SGLang's SIGQUIT
        # handler (the overlay's on 0.5.22+, the series' in the engine), or by the scheduler
        # watcher (0.5.19-0.5.21, where the scheduler's SIGQUIT goes to the follower's DP
        # controller).
        self.assertIn(f"follower sidecar {dynamo.DYNAMO} pid=", log[crash:])
        # ... and stopped first: it must not watch its metadata server disappear (the
        # overlay's server logs its address, the series' engine logs the Rust server's stop:
        # DIFFERENCES.md #2).
        server_stopped = re.search(
            r"Follower metadata server stopped"
            if differences.differs(differences.PLUGIN_LOG_LINES)
            else r"follower metadata server at \S+ stopped",
            log[crash:],
        )
        self.assertIsNotNone(server_stopped, self.follower.log_tail())
        self.assertLess(
            log[crash:].index(f"follower sidecar {dynamo.DYNAMO} pid="),
            server_stopped.start(),
            self.follower.log_tail(),
        )
        nodes.wait_for(
            lambda: fault_rows.sidecar_pids(self.follower) == [],
            GONE_DEADLINE,
            "the follower's sidecar to go",
        )
        ranks = nodes.wait_for(
            lambda: (seen := self._router_ranks(prompt)) is not None
            and 1 not in seen
            and (sorted(seen) or ["none"]),
            GONE_DEADLINE,
            "the router to drop rank 1",
        )
        sys.stderr.write(
            f"[{RELEASE}] follower scheduler raised: node exit {self.follower.proc.returncode}, "
            f"sidecar {sidecar} gone, router ranks now {ranks}\n"
        )
        code, report, text = probe_group(self.leader, self.target(0), self.target(1))
        sys.stderr.write(f"--- probe --group after the crash\n{text}")
        # 1: the follower named; 3: its rendezvous partner gone, the leader's schedulers have
        # failed too, and no node answers (the follower still named).
        self.assertIn(code, (1, 3), text)
        self.assertTrue(any(self.target(1) in field for field in group_errors(report)), text)

    def _router_ranks(self, prompt: list[int]) -> set[int] | None:
        """The DP ranks the router still scores; None when it does not answer."""
        try:
            return set(self.router.overlap(prompt))
        except AssertionError:
            return None


if __name__ == "__main__":
    unittest.main()
