"""``scripts/slurm_guide.py``: the deployment guide's Slurm script, rendered as ``make slurm``
submits it, changes only what a CPU-only machine forces, and the guide's Kubernetes manifest
passes no flag the Slurm run does not exercise."""

from __future__ import annotations

import difflib

import pytest
import slurm_guide

MODEL_ARGS = ["--model-path", "/models/tiny", "--device", "cpu", "--tokenizer-path", "/tok"]
SIZES = ["--tp", "2", "--dp", "2"]
ETCD = "http://192.0.2.12:2379"
EXPORTS = {"SGLANG_PLATFORM": "overlay_cpu", "SGLANG_CPU_OMP_THREADS_BIND": "0|1|0|1"}


def rendered(script: str | None = None) -> str:
    script = slurm_guide.guide_script() if script is None else script
    changes = slurm_guide.cpu_changes(MODEL_ARGS, SIZES, ETCD)
    return slurm_guide.render(script, changes, EXPORTS)


def test_rendering_changes_only_what_the_cpu_forces() -> None:
    guide = slurm_guide.guide_script()
    diff = [line for line in difflib.ndiff(guide.splitlines(), rendered(guide).splitlines())
            if line.startswith(("- ", "+ "))]  # fmt: skip
    removed = [line[2:] for line in diff if line.startswith("- ")]
    added = [line[2:] for line in diff if line.startswith("+ ")]
    changed = (slurm_guide.GPUS, slurm_guide.MODEL, slurm_guide.SIZES, slurm_guide.ETCD)
    assert all(any(old in line for old in changed) for line in removed), removed
    assert "export SGLANG_CPU_OMP_THREADS_BIND='0|1|0|1'" in added
    assert len(added) == len(removed) + len(EXPORTS)


@pytest.mark.parametrize("node_rank", [0, 1])
def test_each_node_keeps_every_flag_and_value_of_the_guide(node_rank: int) -> None:
    guide = slurm_guide.launch_argv(slurm_guide.guide_script(), node_rank, "n0")
    ran = slurm_guide.launch_argv(rendered(), node_rank, "n0")
    assert slurm_guide.flags(guide) <= slurm_guide.flags(ran)
    forced = {"--model-path", "--tp", "--dp"}
    for flag in slurm_guide.flags(guide) - forced - {"--enable-dp-attention"}:
        if flag in guide:
            assert ran[ran.index(flag) + 1] == guide[guide.index(flag) + 1], flag
    assert ran[ran.index("--node-rank") + 1] == str(node_rank)
    assert ran[ran.index("--dist-init-addr") + 1] == "n0:5000"


def test_every_dynamo_process_of_the_script_uses_etcd() -> None:
    script = rendered()
    _srun, frontend = slurm_guide.step_argv(script, slurm_guide.FRONTEND, {})
    assert frontend[frontend.index("--discovery-backend") + 1] == "etcd"
    sidecar = slurm_guide.launch_argv(script, 1, "n0")
    assert '"--discovery-backend", "etcd"' in sidecar[sidecar.index("--sidecar-args") + 1]
    assert f"export ETCD_ENDPOINTS={ETCD}" in script


def test_a_guide_that_drifted_from_the_changes_fails_naming_the_text() -> None:
    drifted = slurm_guide.guide_script().replace("--tp 16 --dp 16", "--tp 8 --dp 8")
    with pytest.raises(ValueError, match="--tp 16 --dp 16"):
        rendered(drifted)


def test_the_kubernetes_manifest_uses_only_flags_the_slurm_run_exercises() -> None:
    script = rendered()
    exercised = set()
    for node_rank in (0, 1):
        exercised |= slurm_guide.flags(slurm_guide.launch_argv(script, node_rank, "n0"))
    manifest = slurm_guide.manifest_flags()
    assert manifest, "no flag found in the guide's manifest"
    assert manifest <= exercised, sorted(manifest - exercised)


def test_the_manifest_check_sees_a_flag_the_slurm_run_never_used() -> None:
    text = slurm_guide.GUIDE.read_text().replace('"--enable-dp-attention"', '"--enable-foo"', 1)
    assert "--enable-foo" in slurm_guide.manifest_flags(text)
