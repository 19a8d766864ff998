"""The Slurm script of ``docs/deployment.md``, read from the guide and rendered for a run.

Standard library only. ``make slurm`` (``overlay_harness.slurm_job``) submits the guide's own
script with ``sbatch``; what a CPU-only machine forces on it (the model, the sizes, the CPU
platform's variables, the cluster's etcd) is a list of :class:`Change`, each of which must find
its text in the guide exactly once, so the guide cannot drift from what runs without the run
failing. The unit tier renders the same script with the same function
(``tests/scripts/test_slurm_guide.py``).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "deployment.md"
SECTION = "## Slurm"
LAUNCH = "sglang.launch_server"
FRONTEND = "dynamo.frontend"
# The script's own variables, as Slurm and the script set them on node NODE_RANK.
LEADER_VARIABLE, RANK_VARIABLE = "LEADER_ADDR", "NODE_RANK"


@dataclasses.dataclass(frozen=True)
class Change:
    """``old`` (text of the guide's script) replaced by ``new``, and why."""

    old: str
    new: str
    why: str


# The guide's text that a CPU-only machine must change, and why.
GPUS = "--gpus-per-node=8 "
MODEL = "--model-path Qwen/Qwen3-8B"
SIZES = "--tp 16 --dp 16"
ETCD = "http://etcd.example.com:2379"


def cpu_changes(model_args: list[str], sizes: list[str], etcd: str) -> list[Change]:
    """The changes this machine makes: ``model_args`` for the model (the model, its tokenizer
    and the CPU platform's launch arguments), ``sizes`` for the parallel sizes, the cluster's
    ``etcd``, and no GPU request."""
    return [
        Change(GPUS, "", "no GPU here"),
        Change(MODEL, shlex.join(model_args), "a model, tokenizer and launch the CPU can run"),
        Change(SIZES, shlex.join(sizes), "one rank per node"),
        Change(ETCD, etcd, "the cluster's etcd"),
    ]


def guide_script(text: str | None = None) -> str:
    """The one ``sh`` block of the guide's Slurm section."""
    text = GUIDE.read_text() if text is None else text
    if SECTION not in text:
        raise ValueError(f"{GUIDE.name}: no section {SECTION!r}")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, flags=re.M | re.S)
    if len(blocks) != 1:
        raise ValueError(f"{GUIDE.name}: the Slurm section has {len(blocks)} sh blocks, not 1")
    return blocks[0]


def render(script: str, changes: list[Change], exports: dict[str, str]) -> str:
    """``script`` with each change applied and ``exports`` set after its ``#SBATCH`` lines."""
    for change in changes:
        found = script.count(change.old)
        if found != 1:
            raise ValueError(f"the guide's Slurm script has {change.old!r} {found} times, "
                             f"not once ({change.why})")  # fmt: skip
        script = script.replace(change.old, change.new)
    lines = script.splitlines(keepends=True)
    header = max(i for i, line in enumerate(lines) if line.startswith(("#!", "#SBATCH"))) + 1
    exported = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in exports.items())
    return "".join(lines[:header]) + exported + "".join(lines[header:])


def _command_lines(script: str, program: str) -> list[str]:
    joined = script.replace("\\\n", " ")
    return [line for line in joined.splitlines() if program in line]


def step_argv(script: str, program: str, variables: dict[str, str]) -> tuple[list[str], list[str]]:
    """(the ``srun`` options, ``program``'s arguments) of the script's one step running
    ``python -m program``, with the script's variables replaced by ``variables``."""
    (line,) = _command_lines(script, program)

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise ValueError(f"the step uses ${name}, which has no value here")
        return variables[name]

    tokens = [re.sub(r"\$\{(\w+)\}|\$(\w+)", value, token) for token in shlex.split(line)]
    tokens = tokens[:-1] if tokens[-1] == "&" else tokens
    at = tokens.index(program)
    return tokens[: at - 2], tokens[at + 1 :]


def launch_argv(script: str, node_rank: int, leader: str) -> list[str]:
    """The SGLang arguments the script starts node ``node_rank`` with."""
    variables = {RANK_VARIABLE: str(node_rank), LEADER_VARIABLE: leader}
    return step_argv(script, LAUNCH, variables)[1]


def flags(argv: list[str]) -> set[str]:
    """The ``--flags`` of ``argv`` and of the JSON list in its ``--sidecar-args``."""
    found = {token for token in argv if token.startswith("--")}
    if "--sidecar-args" in argv:
        inner = argv[argv.index("--sidecar-args") + 1]
        found |= {token for token in re.findall(r'"([^"]*)"', inner) if token.startswith("--")}
    return found


def manifest_flags(text: str | None = None) -> set[str]:
    """Every ``--flag`` the guide's Kubernetes manifest passes (its ``args`` and the JSON list
    in its ``--sidecar-args``)."""
    text = GUIDE.read_text() if text is None else text
    blocks = re.findall(r"^```yaml\n(.*?)^```", text, flags=re.M | re.S)
    return {flag for block in blocks for flag in re.findall(r'"(--[a-z][\w-]*)"', block)}
