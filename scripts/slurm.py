#!/usr/bin/env python3
"""``make slurm``: the deployment guide's Slurm script run as written on a real Slurm cluster.

Standard library only. Debian's Slurm (``slurm-wlm``), munge and etcd are installed with
``apt-get`` when missing (the daemons must run, so the packages are installed, not unpacked;
needs root, as the cluster's network namespaces do). Then, in the env ``make validate`` uses
(SGLang 0.5.23 with the overlay, Dynamo 1.6.1), ``overlay_harness.slurm_job`` starts a
two-node cluster (slurmctld, two slurmd, munge, etcd, each node a host of its own), submits the
guide's script with ``sbatch``, takes the seed's measures through its Dynamo frontend and
cancels the job under load (fault row f). Exit status 0 when every measure passes.

    scripts/slurm.py --wheel-dir dist [--logs slurm-logs]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import dev_paths
from envs import ROOT, find_wheel, log
from validate import column_session

# The programs the cluster runs, and the Debian packages that bring them.
PACKAGES = {"slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "munged": "munge",
            "etcd": "etcd-server", "etcdctl": "etcd-client"}  # fmt: skip


def install_packages() -> None:
    """``apt-get install`` the packages whose programs are missing (services not started:
    the cluster's daemons are the harness's own children)."""
    missing = sorted(
        {package for program, package in PACKAGES.items() if not shutil.which(program)}
    )
    if not missing:
        return
    log(f"slurm: installing {missing}")
    subprocess.run(["apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                   check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel-dir", type=Path, default=ROOT / "dist")
    parser.add_argument("--logs", type=Path, default=ROOT / "slurm-logs",
                        help="the job's script, output and every node's log")  # fmt: skip
    args = parser.parse_args(argv)
    install_packages()
    session = column_session("overlay", find_wheel(args.wheel_dir))
    with tempfile.TemporaryDirectory(prefix="slurm-result-") as tmp:
        out = Path(tmp) / "result.json"
        # From test-registered, ``python -m`` finds the harness there; the guide's renderer
        # (``slurm_guide``, shared with the unit tier) is this folder's.
        command = [str(session.env / "bin" / "python"), "-m", "overlay_harness.slurm_job",
                   "--out", str(out), "--keep-logs", str(args.logs)]  # fmt: skip
        log(f"slurm: deployment 2 by the guide's script, in {session.env.name}")
        environ = dev_paths.child_environ(dev_paths.SCRIPTS, environ=session.environ(None))
        code = subprocess.run(command, env=environ,
                              cwd=ROOT / "test-registered").returncode  # fmt: skip
        result = json.loads(out.read_text()) if out.exists() else {}
    for problem in result.get("problems", []):
        log(f"slurm: {problem}")
    if code != 0 or not result:
        log(f"slurm: failed (exit {code}); logs in {args.logs}")
    return code


if __name__ == "__main__":
    sys.exit(main())
