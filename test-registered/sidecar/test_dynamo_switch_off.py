"""What the ``dp_size`` switch is for: with it off, Dynamo's released sidecar refuses a follower
rank and Dynamo's router never sees it.

CPU-only: the same two-node attention-DP group as ``contract/test_two_node_group.py`` (SGLang's
real schedulers on the CPU test platform, each node its own host), Dynamo's released sidecar
on both nodes under the overlay's supervisor and Dynamo's router on the leader's host, with
``SGLANG_SIDECAR_OVERLAY_LEGACY_DP_SIZE=0`` (and the upstream series' name) set on every node,
which overrides the overlay's default for this consumer.

0.5.22+ report attention DP as ``dp_size=1``: the follower's sidecar exits with "KV source
rank 1 is outside dp_size 1" (the srt-slurm seed's failure), which brings the follower down
(fail-stop), and the router, to which the leader registered ``data_parallel_size=1``, scores
rank 0 only, so a prompt cached on rank 1 is invisible to it. 0.5.19-0.5.21 report
``dp_size=2`` for the same group whether the switch is on or off: there the test shows, with
the release's own server args and the overlay's builder, that the switch changes nothing, and
launches nothing.
"""

import contextlib
import os
import sys
import unittest
from unittest import mock

from overlay_harness import differences, dynamo, kv_events, nodes
from overlay_harness.group import PAGE_SIZE, TINY_MODEL, EngineGroup
from overlay_harness.testcase import NodesTestCase
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_sidecar_overlay import releases

register_cpu_ci(est_time=90, suite="base-a-test-cpu")

RELEASE = releases.installed_sglang_version() or ""
# 0.5.22+ report attention DP as dp_size=1, which Dynamo 1.6.1 checks source ranks against.
ATTENTION_DP_REPORTS_DP_SIZE_1 = releases.adapter_for(RELEASE or "0") == (
    "sglang_sidecar_overlay.adapters.v0_5_22"
)
ATTENTION_DP = ["--tp", "2", "--dp", "2", "--enable-dp-attention"]
STOP_DEADLINE = 120.0
KEEP_RESTARTING = ["--sidecar-restart", "on-failure", "--sidecar-max-restarts", "50",
                   "--sidecar-restart-window", "900"]  # fmt: skip


def reported_dp_size(legacy: bool) -> int:
    """``dp_size`` the overlay's builder reports for this group's leader on this release."""
    from sglang.srt.server_args import prepare_server_args
    from sglang_sidecar_overlay.contract.incarnation import Incarnation
    from sglang_sidecar_overlay.contract.server_info import build_server_info

    server_args = prepare_server_args(
        ["--model-path", str(TINY_MODEL), "--skip-tokenizer-init", "--device", "cpu",
         *ATTENTION_DP]
    )  # fmt: skip
    resolved = getattr(server_args, "resolved_dict", None)
    args = dict(resolved()) if callable(resolved) else dict(vars(server_args))
    sources = [{"dp_rank": r, "endpoint": f"tcp://127.0.0.1:{5557 + r}", "topic": "",
                "block_size": PAGE_SIZE} for r in (0, 1)]  # fmt: skip
    info = build_server_info(
        args, {}, incarnation=Incarnation.new(), kv_event_sources=sources, legacy_dp_size=legacy
    )
    return info["dp_size"]


class TestDynamoSwitchOff(NodesTestCase):
    def test_switch_off_the_follower_rank_is_refused_and_unseen(self):
        if not ATTENTION_DP_REPORTS_DP_SIZE_1:
            # dp_size already counts the publisher ranks: nothing for the consumer to refuse.
            self.assertEqual(reported_dp_size(legacy=False), 2)
            self.assertEqual(reported_dp_size(legacy=True), 2)
            return
        group = EngineGroup(2, ATTENTION_DP)
        env = dynamo.consumer_environ(self.workdir, legacy=False)
        leader_args = dynamo.sidecar_args(follower=False, endpoint=group.grpc_endpoint(0))
        leader_launch = group.launch(
            0, sidecar=dynamo.DYNAMO, sidecar_args=leader_args, extra=dynamo.LEADER_ARGS
        )
        # Restarted on failure, so the refusal does not take the follower (and with it the
        # group's rendezvous partner, the leader) down while the router is asked.
        follower_launch = group.launch(
            1,
            sidecar=dynamo.DYNAMO,
            sidecar_args=[
                *dynamo.sidecar_args(follower=True, endpoint=group.grpc_endpoint(1)),
                *KEEP_RESTARTING,
            ],
        )
        with (
            mock.patch.dict(os.environ, env, clear=True),
            nodes.running(leader_launch, follower_launch, names=["leader", "follower"],
                          log_dir=self.workdir) as (leader, follower),
            contextlib.ExitStack() as stack,
        ):  # fmt: skip
            for node in (leader, follower):
                node.expect_ready()
            router = dynamo.Router(leader.host, PAGE_SIZE, self.workdir / "router.log")
            stack.callback(router.stop)
            self.assertEqual(follower.server_info()["dp_size"], 1)
            line = nodes.wait_for(
                lambda: next(
                    (ln for ln in follower.log_text().splitlines()
                     if dynamo.RANK_OUTSIDE_DP_SIZE in ln), None
                ),
                STOP_DEADLINE,
                "the follower's sidecar to refuse rank 1",
            )  # fmt: skip
            refusal_exit = differences.sidecar_exit_line(dynamo.DYNAMO, "exited with code 1")
            nodes.wait_for(
                lambda: refusal_exit in follower.log_text(),
                STOP_DEADLINE,
                "the supervisor to see the refusal",
            )
            # A prompt cached on rank 1 is invisible: the router knows rank 0 only.
            prompt = kv_events.prompt()
            leader.generate(prompt, 4, 1)
            scores = router.wait_for_ranks({0}, prompt)
            self.assertEqual(scores, {0: 0})
            log = follower.log_text()
            self.assertNotIn(dynamo.WAITING_FOR_LEADER, log)
            sys.stderr.write(
                f"[{RELEASE}] switch off: {line.strip()[-160:]}; router scores {scores}\n"
            )


if __name__ == "__main__":
    unittest.main()
