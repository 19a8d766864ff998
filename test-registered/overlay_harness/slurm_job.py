"""Deployment 2 (the two-node attention-DP group) launched by the deployment guide's own Slurm
script on a real Slurm cluster (``overlay_harness.slurm``), with etcd as Dynamo's discovery, the
seed's measures through the script's Dynamo frontend, then ``scancel`` under load (fault row f).

The script is read from ``docs/deployment.md`` and rendered by ``scripts/slurm_guide.py`` (the
function the unit tier checks the guide with), changing only what this CPU-only machine forces:
the model and its tokenizer, the sizes, the CPU platform's variables, the cluster's etcd. It is
submitted with ``sbatch``; each node is the ``srun`` step Slurm started on it
(:class:`StepNode`), asked from its own host as the harness asks every node. Dynamo's
standalone router runs beside the leader as the oracle of what the events told a router.

Run as ``python -m overlay_harness.slurm_job --out RESULT.json [--keep-logs DIR]`` from
``test-registered`` (``scripts/slurm.py``, ``make slurm``); exit 0 when every measure passes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import slurm_guide  # scripts/'s, on the path make slurm gives this process
from sglang_sidecar_overlay import entry_point
from sglang_sidecar_overlay.sidecar import proctree

from overlay_harness import (
    checks,
    dynamo,
    fault_rows,
    kv_events,
    netns,
    nodes,
    seed_checks,
    slurm,
    tokenizer,
)
from overlay_harness.deployments import ATTENTION_DP, Deployment
from overlay_harness.group import CPU_ARGS, OMP_THREADS_BIND, PAGE_SIZE, PLATFORM, TINY_MODEL

NNODES = 2
READY_DEADLINE = nodes.NODE_READY_DEADLINE
DEPLOYMENT = "attention DP aggregate under Slurm: TP2/attention-DP2, 2 nodes"
# How srun reports a task's end in the job's output, and the exit codes fault row f reads.
TASK_END = re.compile(
    r"srun: error: (\S+): task \d+: (Terminated|Killed|Exited with exit code (\d+))"
)
TASK_CODES = {"Terminated": -15, "Killed": -9}


def cpu_changes(tokenizer_path: Path, etcd: str) -> list:
    """What this machine changes in the guide's script (``slurm_guide.cpu_changes``)."""
    model = ["--model-path", str(TINY_MODEL), *CPU_ARGS, "--tokenizer-path", str(tokenizer_path)]
    return slurm_guide.cpu_changes(model, ATTENTION_DP[:4], etcd)


CPU_EXPORTS = {"SGLANG_PLATFORM": PLATFORM, "SGLANG_CPU_OMP_THREADS_BIND": OMP_THREADS_BIND,
               "GLOO_SOCKET_IFNAME": netns.NODE_INTERFACE}  # fmt: skip


class StepTask:
    """The process Slurm started for one step on a node (not this process's child): what
    fault row f reads of a node's ``proc``. Its exit code is the one srun reported in the
    job's output (None while none is)."""

    def __init__(self, pid: int, node: str, job_output: Path) -> None:
        self.pid, self.node, self.job_output = pid, node, job_output
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return None if checks.alive(self.pid) else (self.returncode or self._reported())

    def _reported(self) -> int | None:
        codes = [TASK_CODES.get(how, int(code or 0)) for node, how, code
                 in TASK_END.findall(self.job_output.read_text(errors="replace"))
                 if node == self.node]  # fmt: skip
        # Two steps on the leader's node (the engine, the frontend): the worst one counts.
        unexpected = [code for code in codes if code not in fault_rows.STOP_EXIT_CODES]
        self.returncode = (unexpected or codes or [None])[0]
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        nodes.wait_for(lambda: not checks.alive(self.pid), timeout, f"step task {self.pid}")
        with contextlib.suppress(AssertionError):  # srun reports when its step has ended
            nodes.wait_for(self._reported, 10.0, "")
        return self.returncode


def step_processes(job: str, netns_inode: int, program: str) -> tuple[int, int] | None:
    """(the step's slurmstepd, its task) of job ``job`` running ``python -m program`` in the
    network namespace ``netns_inode``."""
    for pid, stat in proctree.process_table().items():
        with contextlib.suppress(OSError):  # gone meanwhile
            stepd = Path(f"/proc/{stat.ppid}/cmdline").read_bytes()
            if (stepd.startswith(f"slurmstepd: [{job}.".encode())
                    and os.stat(f"/proc/{pid}/ns/net").st_ino == netns_inode
                    and program.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()):  # fmt: skip
                return stat.ppid, pid
    return None


class StepNode:
    """One node of the group, as the guide's ``srun`` step started it: what the harness asks
    of a node (``nodes.Node``'s attributes the measures and fault row f read)."""

    def __init__(self, cluster: slurm.Cluster, job: str, workdir: Path, node_rank: int,
                 args: list[str]) -> None:  # fmt: skip
        self.node_rank, self.name = node_rank, f"node{node_rank}"
        self.host = cluster.node_host(f"n{node_rank}")
        self.address = self.host.address
        self.grpc_port = int(args[args.index("--grpc-port") + 1])
        self.http_port = int(args[args.index("--port") + 1])
        self.log_path = workdir / f"node{node_rank}-{job}.log"
        inode = os.stat(f"/run/netns/{self.host.netns}").st_ino
        self.stepd, task = nodes.wait_for(
            lambda: step_processes(job, inode, "sglang.launch_server"), READY_DEADLINE,
            f"job {job}'s step on n{node_rank}",
        )  # fmt: skip
        self.proc = StepTask(task, f"n{node_rank}", workdir / f"job-{job}.out")
        self._seen: set[tuple[int, int]] = set()

    def pids(self) -> list[int]:
        """Every live process of the step seen so far (an orphan leaves the step's tree)."""
        table = proctree.process_table()
        if checks.alive(self.stepd):
            self._seen.update(proctree.descendants(self.stepd, table))
        return sorted(pid for pid, start in self._seen if proctree.is_running((pid, start)))

    def log_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def executed(self) -> list[str]:
        """The SGLang arguments the node's process runs with."""
        argv = Path(f"/proc/{self.proc.pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        return argv[argv.index("sglang.launch_server") + 1 :]


class StepFrontend(dynamo.Frontend):
    """Dynamo's frontend as the guide's script starts it on the leader's node."""

    def __init__(self, leader: StepNode, port: int, log_path: Path, job: str) -> None:
        self.host, self.address, self.port = leader.host, leader.address, port
        self.model, self.log_path, self.python, self.environ = None, log_path, sys.executable, None
        inode = os.stat(f"/run/netns/{leader.host.netns}").st_ino
        _stepd, pid = nodes.wait_for(lambda: step_processes(job, inode, "dynamo.frontend"),
                                     READY_DEADLINE, "the frontend's step")  # fmt: skip
        self.argv = ["dynamo.frontend"]
        self.proc = StepTask(pid, "n0", log_path.with_name(f"job-{job}.out"))


def job_environ(workdir: Path) -> dict[str, str]:
    """What ``sbatch`` passes on to the job (Slurm exports the submitter's environment): the
    env's PATH, the nodes' plugins and diagnostics as the harness starts any node, no Dynamo
    transport settings nor etcd endpoint (the script's own flags and export choose them), and a
    home for the frontend."""
    environ = {key: value for key, value in dynamo.consumer_environ(workdir, legacy=None).items()
               if key not in dynamo.TRANSPORT_ENV and key != "DYN_FILE_KV"}  # fmt: skip
    environ.update(node_process_environ(), HOME=str(workdir / "home"))
    return environ


def node_process_environ() -> dict[str, str]:
    return {**nodes.NO_CRASH_DIAGNOSTICS, entry_point.SGLANG_PLUGINS_ENV: nodes.plugin_allow_list()}


def router_environ(etcd: str) -> dict[str, str]:
    """The oracle router's environment: Dynamo's etcd discovery, as the script's processes."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "ETCD_"))},
            **dynamo.TRANSPORT_ENV, "DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": etcd,
            "DYN_LOG": "info", "NO_COLOR": "1"}  # fmt: skip


def write_script(workdir: Path, cluster: slurm.Cluster) -> str:
    """The guide's script rendered for this cluster, written to ``workdir/job.sh``."""
    tokenizer_path = tokenizer.build(TINY_MODEL, workdir / "tokenizer")
    changes = cpu_changes(tokenizer_path, cluster.etcd_endpoint)
    script = slurm_guide.render(slurm_guide.guide_script(), changes, CPU_EXPORTS)
    (workdir / "job.sh").write_text(script)
    return script


def submit(cluster: slurm.Cluster, workdir: Path) -> str:
    """``sbatch`` the rendered script from ``workdir``; the job id."""
    proc = cluster.client(["sbatch", "--parsable", f"--chdir={workdir}",
                           f"--output={workdir}/job-%j.out", str(workdir / "job.sh")],
                          env=job_environ(workdir))  # fmt: skip
    return proc.stdout.strip().split(";")[0]


def frontend_port(script: str) -> int:
    _srun, args = slurm_guide.step_argv(script, slurm_guide.FRONTEND, {})
    return int(args[args.index("--http-port") + 1])


def bring_up(stack: contextlib.ExitStack, cluster: slurm.Cluster, workdir: Path,
             result: dict) -> Deployment:  # fmt: skip
    """Submit the guide's script and wait for deployment 2 to serve through its frontend;
    ``result`` gets the times, the memory and what each node ran."""
    script = write_script(workdir, cluster)
    began = time.monotonic()
    job = result["job"] = submit(cluster, workdir)
    follower = StepNode(cluster, job, workdir, 1, slurm_guide.launch_argv(script, 1, "n0"))
    leader = StepNode(cluster, job, workdir, 0, slurm_guide.launch_argv(script, 0, "n0"))
    for node in (leader, follower):
        if node.executed() != slurm_guide.launch_argv(script, node.node_rank, "n0"):
            result["problems"].append(f"{node.name} runs {node.executed()}, not the script's")
    router = dynamo.Router(leader.host, PAGE_SIZE, workdir / "router.log",
                           environ=router_environ(cluster.etcd_endpoint))  # fmt: skip
    stack.callback(router.stop)
    nodes.wait_for(lambda: targets_known(router, follower), READY_DEADLINE,
                   "the router to score both ranks")  # fmt: skip
    targets = seed_checks.registered_targets(router, NNODES)
    frontend = StepFrontend(leader, frontend_port(script), workdir / f"frontend-{job}.log",
                            job)  # fmt: skip
    frontend.wait_for_model()
    result["sbatch to ready (s)"] = round(time.monotonic() - began, 1)
    result["targets"] = targets
    return Deployment([leader, follower], "", frontend, router, NNODES)


def targets_known(router: dynamo.Router, follower: StepNode) -> bool:
    """Whether the router scores both ranks (it answers once the leader registered); fails
    once the follower's step has ended."""
    if follower.proc.poll() is not None:
        raise AssertionError(f"the follower's step ended\n{follower.log_text()[-3000:]}")
    with contextlib.suppress(AssertionError):
        return len(router.target_scores(kv_events.prompt())) == NNODES
    return False


def job_pss_gib(deployment: Deployment, cluster: slurm.Cluster) -> float:
    """The PSS of every process of the job and of the cluster's daemons, in GiB."""
    pids = {pid for node in deployment.nodes for pid in node.pids()}
    pids |= set(nodes.pids_of_tree(cluster.daemon_pids()))
    return round(checks.memory_kib(sorted(pids))[1] / 2**20, 2)


# Slurm signals every process of a step (proctrack/linuxproc, as proctrack/cgroup does), the
# sidecar too: a sidecar that stopped before its server on Slurm's SIGTERM, not its node's.
SLURM_TOLD_THE_SIDECAR = "sidecar stopped without a SIGTERM from the node"
CANCELLED = re.compile(r"\*\*\* STEP \d+\.\d+ ON (\S+) CANCELLED AT")


def cancel_under_load(cluster: slurm.Cluster, deployment: Deployment, workdir: Path,
                      result: dict) -> None:  # fmt: skip
    """Fault row f's measure with ``scancel`` as the stop; then the job's end as Slurm
    reports it (each node's task in the job's output, each step's cancel in its node's log)
    and the time until Slurm forgot the job."""
    job = result["job"]
    cell = fault_rows.group_stopped(
        deployment, "overlay", grace=slurm.KILL_WAIT, fault="scancel",
        stop=lambda _group: cluster.client(["scancel", job]),
    )  # fmt: skip
    began = time.monotonic()
    nodes.wait_for(lambda: not cluster.queued(job), slurm.KILL_WAIT + 15, f"job {job} to end")
    result["every process gone after scancel (s)"] = cell.recovery["every process gone"]
    result["then job gone from squeue (s)"] = round(time.monotonic() - began, 1)
    result["row f"] = cell.summary()
    for problem in cell.problems:
        accepted = problem.endswith(SLURM_TOLD_THE_SIDECAR)
        result["notes" if accepted else "problems"].append(f"row f: {problem}")
    output = (workdir / f"job-{job}.out").read_text(errors="replace")
    result["job output's task ends"] = TASK_END.findall(output)
    reported = {node for node, _how, _code in TASK_END.findall(output)}
    for node in deployment.nodes:
        host = f"n{node.node_rank}"
        if host not in reported or host not in CANCELLED.findall(node.log_text()):
            result["problems"].append(f"{host}'s end is not in the job's output and its log")


def run(workdir: Path) -> dict:
    """Deployment 2 by the guide's script: up, measured, cancelled under load."""
    result: dict = {"problems": [], "notes": []}
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(slurm.Cluster(NNODES))
        deployment = bring_up(stack, cluster, workdir, result)
        result["PSS at ready (GiB)"] = job_pss_gib(deployment, cluster)
        measured = seed_checks.measure(DEPLOYMENT, deployment.frontend, deployment.router,
                                       result["targets"], with_benchmark=True)  # fmt: skip
        measured.report()
        result["PSS after the measures (GiB)"] = job_pss_gib(deployment, cluster)
        try:
            measured.assert_seed_pass()
        except AssertionError as error:
            result["problems"].append(f"measures: {error}")
        cancel_under_load(cluster, deployment, workdir, result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--keep-logs", type=Path)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="overlay-slurm-job-"))
    try:
        result = run(workdir)
    finally:
        if args.keep_logs is not None:
            shutil.copytree(workdir, args.keep_logs, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("home", "tokenizer"))  # fmt: skip
        shutil.rmtree(workdir, ignore_errors=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
