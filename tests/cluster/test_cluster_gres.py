"""GPUs declared as GRES, as clusters do (`devcluster up --gpus-per-node 2`: GresTypes=gpu, a
gres.conf whose File= are stand-in device files, since there are no GPUs here). slurmctld accepts
every GPU form slurmkit renders, and really allocates the GPUs a job asks for."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from slurmkit.common.layout import RunPaths
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs
from slurmkit.slurm import preflight
from tests.cluster.test_cluster_faults import finish

pytestmark = pytest.mark.cluster
GPU_FORMS = [
    ["resources.gpus_per_node=2"],
    ["resources.gpus_per_task=1", "resources.tasks_per_node=2"],
    ["resources.gres=gpu:1"],
    ["resources.gres=gpu:2", "resources.cpus_per_gpu=1"],
    ["resources.gpus_per_node=1", "resources.mem_per_gpu=100M"],
]


@pytest.fixture(scope="module")
def gres_cluster(cluster: None) -> Iterator[None]:
    from slurmkit.devcluster import cluster as dc
    from slurmkit.devcluster.names import Variant

    dc.up(2, log=lambda _: None, variant=Variant(gpus_per_node=2))
    try:
        yield
    finally:
        dc.up(2, log=lambda _: None)  # back to the suite's cluster, without GPUs


def spec(tmp_path: Path, command: str) -> Path:
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump({"name": "gpu", "command": command, "resources": {"time": "00:05:00"}}))
    return path


@pytest.mark.parametrize("sets", GPU_FORMS, ids=[" ".join(s) for s in GPU_FORMS])
def test_sbatch_test_only_accepts_every_gpu_form(gres_cluster: None, tmp_path: Path, dev_profile: Path,
                                                 sets: list[str]) -> None:
    resolved = resolve(spec(tmp_path, "true"), str(dev_profile), ["profile.health_gate=never", *sets])
    assert preflight.check(resolved) == "debug"  # the partition has the GRES asked for
    script = tmp_path / "job.sh"
    script.write_text(jobs.dry_run(resolved).script)
    out = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "to start at" in out.stderr, out.stderr


def test_a_job_asking_for_one_gpu_is_allocated_one(gres_cluster: None, tmp_path: Path, dev_profile: Path) -> None:
    command = 'echo "cuda=$CUDA_VISIBLE_DEVICES"; scontrol show job -d "$SLURM_JOB_ID" | grep -o "GRES=[^ ]*"'
    resolved = resolve(spec(tmp_path, command), str(dev_profile), ["profile.health_gate=never",
                                                                   "resources.gres=gpu:1"])
    paths = RunPaths(Path(jobs.submit(resolved).run_dir))
    assert finish(paths) == "COMPLETED"
    out = jobs.result(paths)["stdout"]
    assert "cuda=0" in out and "GRES=gpu:1(IDX:0)" in out, out
