"""GPUs the way clusters declare them: gpus_per_node, gpus_per_task, gres, cpus_per_gpu, mem_per_gpu.
Each renders as its sbatch option; the health gate, container GPU flags and Ray see the GPUs
whichever form asked; contradictions are one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmkit.errors import ConfigError
from slurmkit.load.loader import resolve
from slurmkit.runs.jobs import dry_run
from tests.conftest import EXAMPLES
from tests.unit.test_render import check_shell, supervisor_call


def script(tmp_path: Path, spec_resources: dict[str, Any], **profile: Any) -> tuple[int, str]:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp_path / "runs"), **profile}))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "g", "command": "nvidia-smi -L", "resources": spec_resources}))
    resolved = resolve(spec, str(path))
    return resolved.node_gpus, dry_run(resolved).script


@pytest.mark.parametrize(("resources", "lines", "gpus"), [
    ({"gpus_per_node": 4}, ["--gpus-per-node=4", "--cpus-per-task=1"], 4),
    ({"gpus_per_task": 1, "tasks_per_node": 4}, ["--gpus-per-task=1"], 4),
    ({"gres": "gpu:a100:4", "cpus_per_gpu": 8, "mem_per_gpu": "40GB"},
     ["--gres=gpu:a100:4", "--cpus-per-gpu=8", "--mem-per-gpu=40G"], 4),
    ({"gres": "gpu,nvme:1"}, ["--gres=gpu,nvme:1"], 1),
    ({"gres": "nvme:2"}, ["--gres=nvme:2"], 0),
])
def test_each_gpu_form_renders_and_counts(tmp_path: Path, resources: dict[str, Any], lines: list[str],
                                          gpus: int) -> None:
    node_gpus, text = script(tmp_path, resources)
    check_shell(text, tmp_path)
    for line in lines:
        assert f"#SBATCH {line}" in text
    assert node_gpus == gpus
    # The health gate runs (and checks the count) for a GPU job, whichever form asked.
    health = supervisor_call(text)[0].health
    assert (health is not None and health.gpus == gpus) if gpus else health is None
    if "cpus_per_gpu" in resources:  # Slurm takes one of them: the profile's gives way to the spec's
        assert "--cpus-per-task" not in text and "#SBATCH --mem=" not in text


def test_a_profiles_per_gpu_memory_gives_way_to_a_specs_mem(tmp_path: Path) -> None:
    _, text = script(tmp_path, {"gres": "gpu:1", "mem": "20G"}, resources={"mem_per_gpu": "10G"})
    assert "#SBATCH --mem=20G" in text and "--mem-per-gpu" not in text


def test_container_gpu_flags_follow_a_gres_request(tmp_path: Path) -> None:
    container = {"runtime": "apptainer", "image": "/images/torch.sif"}
    _, with_gpu = script(tmp_path, {"gres": "gpu:2"}, container=container)
    _, without = script(tmp_path, {"gres": "nvme:1"}, container=container)
    assert "--nv" in with_gpu and "--nv" not in without


def test_ray_gets_the_gpus_of_any_form(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp_path / "runs")}))
    resolved = resolve(EXAMPLES / "ray_hostnames.yaml", str(path), ["resources.gres=gpu:a100:2"])
    assert "--num-gpus=2" in dry_run(resolved).script


@pytest.mark.parametrize(("resources", "where", "what"), [
    ({"gpus_per_node": 2, "gres": "gpu:2"}, "resources.gres", "GPUs asked for twice: gpus_per_node and gres"),
    ({"gpus_per_node": 2, "gpus_per_task": 1}, "resources.gpus_per_task", "asked for twice"),
    ({"cpus_per_gpu": 4}, "resources.cpus_per_gpu", "cpus_per_gpu without GPUs"),
    ({"gres": "gpu:1", "mem_per_gpu": "10G", "mem": "20G"}, "resources.mem_per_gpu", "mem_per_gpu with mem"),
    ({"gres": "gpu:1", "cpus_per_gpu": 2, "cpus_per_task": 2}, "resources.cpus_per_gpu", "cpus_per_gpu with"),
    ({"gres": "gpu:a100:four"}, "resources.gres", "invalid gres item 'gpu:a100:four'"),
])
def test_contradictions_are_one_line(tmp_path: Path, resources: dict[str, Any], where: str, what: str) -> None:
    with pytest.raises(ConfigError) as err:
        script(tmp_path, resources)
    line = str(err.value)
    assert f"s.yaml:{where}" in line and what in line and "valid:" in line and "\n" not in line
