"""KV-aware routing to a follower node, on this machine: the demo ``make demo`` runs.

Runs inside an SGLang 0.5.23 environment built by ``scripts/sglang_envs.py`` (with this
project's wheel, the CPU test platform and NVIDIA Dynamo's released sidecar and router in it),
as root: it creates two private network namespaces on a bridge of its own (192.0.2.0/24, a
documentation range; nothing is routed off the machine), one per node, and removes them when it
ends. On them it runs, and prints:

1. ``python -m sglang.launch_server`` on both nodes: a two-node ``--tp 2 --dp 2
   --enable-dp-attention`` group of SGLang's real schedulers on the CPU (a tiny config-only
   model with dummy weights), each with ``--sidecar dynamo.sglang.sidecar`` under the overlay's
   supervisor (relay mode on the follower, ``--sidecar-on-followers``);
2. ``python -m dynamo.router`` on the leader's host;
3. a prompt pinned to rank 1 (which lives on the follower) and one pinned to rank 0, with the
   router's overlap scores before and after each;
4. both prompts again through the router's ``generate``, unpinned: which rank served each,
   and the cached tokens SGLang reported.

Usage: ``make demo``, which runs ``ENV/bin/python scripts/demo_routing.py`` with the harness
(``test-registered``) importable (``dev_paths.child_environ``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from overlay_harness import dynamo, kv_events, probes
from overlay_harness.group import PAGE_SIZE, EngineGroup, Launch
from overlay_harness.inside import HARNESS_ROOT, harness_environ, run
from overlay_harness.nodes import wait_for

ATTENTION_DP = ["--tp", "2", "--dp", "2", "--enable-dp-attention"]
READY_DEADLINE = 600.0
NEW_TOKENS = 4


def say(text: str = "") -> None:
    print(text, flush=True)


REPOSITORY = HARNESS_ROOT.parent


def as_typed(argv: list[str]) -> str:
    """``argv`` as a person would type it in the env, from the repository's root: ``python``
    for the env's interpreter, paths in the repository relative to it."""
    prefix = f"{REPOSITORY}/"
    words = ["python" if word == sys.executable else word.replace(prefix, "") for word in argv]
    return shlex.join(words)


def shown(launch: Launch, argv: list[str], environ: dict[str, str]) -> str:
    """The command line as a person would type it on the node."""
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in environ.items())
    return f"[node {launch.node_rank}, {launch.address}] {env} {as_typed(argv)}"


class ServerProcess:
    """``python -m sglang.launch_server`` for one node, in its own namespace and session."""

    def __init__(self, launch: Launch, workdir: Path):
        self.launch = launch
        self.log_path = workdir / f"node{launch.node_rank}.log"
        argv = [sys.executable, "-m", "sglang.launch_server", *launch.args]
        environ = {**launch.environ, "SGLANG_PLUGINS": "sidecar_overlay"}
        say(shown(launch, argv, environ))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                launch.host.node_command(argv),
                env={**harness_environ(), **environ},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=HARNESS_ROOT,
                start_new_session=True,
            )

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise SystemExit(f"node {self.launch.node_rank} exited {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def leader_ready(leader: ServerProcess) -> bool:
    leader.check_alive()
    with contextlib.suppress(AssertionError):
        status, _ = run(leader.launch.host, probes.http_text, leader.launch.http_port,
                        leader.launch.address, "/health")  # fmt: skip
        return status == 200
    return False


def follower_ready(follower: ServerProcess) -> bool:
    follower.check_alive()
    launch = follower.launch
    with contextlib.suppress(AssertionError):
        return run(launch.host, probes.health, launch.grpc_port, launch.address) == 1
    return False


def main() -> int:
    if os.geteuid() != 0:
        raise SystemExit("the demo creates network namespaces: run it as root")
    with (
        tempfile.TemporaryDirectory(prefix="overlay-demo-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        workdir = Path(tmp)
        os.environ.update(dynamo.consumer_environ(workdir, legacy=None))
        group = EngineGroup(2, ATTENTION_DP)
        group.network.acquire()
        stack.callback(group.network.release)
        leader_host, follower_host = group.host(0), group.host(1)
        say(f"== two hosts: {leader_host.netns} ({leader_host.address}), "
            f"{follower_host.netns} ({follower_host.address}), on a private bridge")  # fmt: skip
        say("== the two nodes (follower first: it waits for its leader in the rendezvous)")
        follower_args = dynamo.sidecar_args(follower=True, endpoint=group.grpc_endpoint(1))
        follower = ServerProcess(
            group.launch(1, sidecar=dynamo.DYNAMO, sidecar_args=follower_args), workdir
        )
        stack.callback(follower.stop)
        leader_args = dynamo.sidecar_args(follower=False, endpoint=group.grpc_endpoint(0))
        leader = ServerProcess(
            group.launch(
                0, sidecar=dynamo.DYNAMO, sidecar_args=leader_args, extra=dynamo.LEADER_ARGS
            ),
            workdir,
        )
        stack.callback(leader.stop)
        began = time.monotonic()
        wait_for(lambda: leader_ready(leader) and follower_ready(follower), READY_DEADLINE,
                 "both nodes to be ready")  # fmt: skip
        say(f"   ready after {time.monotonic() - began:.0f} s")

        say("== Dynamo's router, on the leader's host")
        router = dynamo.Router(leader_host, PAGE_SIZE, workdir / "router.log")
        stack.callback(router.stop)
        say(f"[node 0, {leader_host.address}] {as_typed(router.argv)}")

        prompts = {1: kv_events.prompt(), 0: kv_events.prompt()}
        say(f"== overlap scores (matched {PAGE_SIZE}-token pages per DP rank) before anything: "
            f"{ {r: router.wait_for_ranks({0, 1}, p) for r, p in prompts.items()} }")  # fmt: skip
        for rank, prompt in prompts.items():
            run(leader_host, probes.generate, group.http_ports[0], leader_host.address, prompt,
                NEW_TOKENS, rank)  # fmt: skip
            scores = wait_for(lambda p=prompt, r=rank: (s := router.overlap(p))[r] and s, 120,
                              "the router to see the prompt")  # fmt: skip
            say(f"   prompt {rank}: {len(prompt)} tokens pinned to rank {rank} "
                f"(routed_dp_rank); router's overlap scores now {scores}")  # fmt: skip
        say("== both prompts again, through the router's generate, unpinned")
        for rank, prompt in prompts.items():
            result = router.generate(prompt, NEW_TOKENS)
            where = "the follower node" if result["prefill_dp_rank"] == 1 else "the leader node"
            say(
                f"   prompt {rank}: routed to DP rank {result['prefill_dp_rank']} ({where}), "
                f"{result['cached_tokens']} of {result['prompt_tokens']} prompt tokens cached"
            )
        log = follower.log_path.read_text(errors="replace")
        cached = [
            ln.split("] ", 1)[-1][:110] for ln in log.splitlines() if "#cached-token: 8" in ln
        ]
        say(f"== the follower's own log of that prefill: {json.dumps(cached[:1])}")
        say("== stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
