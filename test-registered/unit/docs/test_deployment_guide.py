"""Every launch command of ``docs/deployment.md`` parses with this release's real ``ServerArgs``
argument parser, and its ``--sidecar-args`` with the overlay's own option parsing.

Launches nothing. Shell blocks (``sh``) and the Kubernetes manifest (``yaml``) are read from the
guide itself, so a flag renamed upstream or a typo in the guide fails here, on every supported
release. Shell and Kubernetes variables are replaced by example values; an unknown one fails.
"""

import argparse
import json
import re
import shlex
import unittest
from pathlib import Path

import yaml
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay.contract.server_info import LEGACY_DP_SIZE_ENV, legacy_dp_size_enabled
from sglang_sidecar_overlay.sidecar.supervisor import SidecarOptions

register_cpu_ci(est_time=1, suite="base-a-test-cpu")

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "deployment.md"
LAUNCH = "sglang.launch_server"
# Values the guide's variables stand for (Slurm, then LeaderWorkerSet).
EXAMPLES = {
    "NODE_RANK": "1",
    "LEADER_ADDR": "10.0.0.1",
    "LWS_LEADER_ADDRESS": "10.0.0.1",
    "LWS_WORKER_INDEX": "1",
}
# sh launch lines (two aggregate nodes, the DP pair, prefill, decode, Slurm) + two pods.
EXPECTED_COMMANDS = 8


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)


def substitute(token: str) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name not in EXAMPLES:
            raise AssertionError(f"the guide uses ${name}, which has no example value here")
        return EXAMPLES[name]

    return re.sub(r"\$\((\w+)\)|\$\{(\w+)\}|\$(\w+)", value, token)


def shell_commands(text: str) -> list[tuple[list[str], list[str]]]:
    """(prefix tokens, SGLang argv) of every sh line that runs the launcher."""
    found = []
    for block in fenced_blocks(text, "sh"):
        for line in block.replace("\\\n", " ").splitlines():
            if LAUNCH not in line:
                continue
            tokens = [substitute(token) for token in shlex.split(line)]
            if tokens[-1] == "&":
                tokens = tokens[:-1]
            at = tokens.index(LAUNCH)
            found.append((tokens[: at - 2], tokens[at + 1 :]))  # before `python -m`
    return found


def manifest_commands(text: str) -> list[tuple[list[str], list[str]]]:
    """(env assignments, SGLang argv) of every container that runs the launcher."""
    found = []
    for block in fenced_blocks(text, "yaml"):
        for document in yaml.safe_load_all(block):
            for container in _containers(document):
                if LAUNCH in container.get("command", []):
                    env = [f"{item['name']}={item['value']}" for item in container.get("env", [])]
                    found.append((env, [substitute(arg) for arg in container["args"]]))
    return found


def _containers(node):
    if isinstance(node, dict):
        if "containers" in node:
            yield from node["containers"]
        for value in node.values():
            yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


class TestDeploymentGuide(CustomTestCase):
    def setUp(self):
        self.text = GUIDE.read_text(encoding="utf-8")
        self.parser = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
        ServerArgs.add_cli_args(self.parser)

    def parse(self, argv: list[str]) -> argparse.Namespace:
        try:
            return self.parser.parse_args(argv)
        except (argparse.ArgumentError, SystemExit) as exc:
            raise AssertionError(f"SGLang's parser refuses {shlex.join(argv)}: {exc}") from None

    def test_every_launch_command_parses(self):
        commands = shell_commands(self.text) + manifest_commands(self.text)
        self.assertEqual(len(commands), EXPECTED_COMMANDS, [argv[:4] for _, argv in commands])
        for prefix, argv in commands:
            with self.subTest(command=shlex.join(argv)):
                args = self.parse(argv)
                self.assertEqual(args.grpc_port, 50051)
                self.assertEqual(args.sidecar, "dynamo.sglang.sidecar")
                options, provider_args = SidecarOptions.from_args(args.sidecar_args)
                # Zero-config Dynamo: the supervisor passes the endpoint.
                self.assertNotIn("--grpc-endpoint", provider_args)
                self.assertEqual(options.on_followers, args.nnodes > 1)
                if args.nnodes > 1:
                    self.assertRegex(args.dist_init_addr, r"^10\.0\.0\.1:\d+$")
                kv_events = json.loads(args.kv_events_config)
                self.assertEqual(kv_events["publisher"], "zmq")
                # Zero configuration: no recipe sets the dp_size switch, and unset it is on for
                # the recipe's --sidecar (the shape every Dynamo version registers exactly).
                exported = [
                    item.partition("=")[0]
                    for assignment in prefix
                    for item in assignment.removeprefix("--export=").split(",")
                ]
                self.assertNotIn(LEGACY_DP_SIZE_ENV, exported, prefix)
                self.assertTrue(legacy_dp_size_enabled({}, sidecar=args.sidecar), args.sidecar)

    def test_groups_in_the_guide_agree_per_node(self):
        """The two nodes of a group differ only in --node-rank."""
        commands = [argv for _, argv in shell_commands(self.text)]
        aggregate = [argv for argv in commands if "--enable-dp-attention" in argv][:2]
        self.assertEqual(len(aggregate), 2)
        first, second = (self.parse(argv) for argv in aggregate)
        self.assertEqual((first.node_rank, second.node_rank), (0, 1))
        self.assertEqual(
            {k: v for k, v in vars(first).items() if k != "node_rank"},
            {k: v for k, v in vars(second).items() if k != "node_rank"},
        )


if __name__ == "__main__":
    unittest.main()
