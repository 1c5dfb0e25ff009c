"""A local run's GPUs: submitit's local executor shows the ranks the GPUs asked for and no others,
so the request is passed on, checked against this machine, and a GPU machine's GPUs left unasked are said.

Found on an H200 (benchmarks/gpu_check.sh): `slurmkit submit` on the local profile trained on CPU
there, because gpus_per_node never reached submitit, which then set CUDA_VISIBLE_DEVICES to none.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmkit.errors import SlurmkitError
from slurmkit.load.loader import resolve
from slurmkit.runs import local_checks
from slurmkit.slurm.submitit_executor import local_executor

TRAIN = {"name": "t", "task": "train", "config": {"steps": 1}}


@pytest.mark.parametrize(("resources", "gpus"), [({}, 0), ({"gpus_per_node": 2}, 2),
                                                 ({"gpus_per_task": 1, "tasks_per_node": 2}, 2)])
def test_the_local_executor_is_given_the_gpus_asked_for(resources: dict[str, int], gpus: int, tmp_path: Path) -> None:
    resolved = resolve({**TRAIN, "resources": resources}, "local")
    assert local_executor(tmp_path, resolved).parameters["gpus_per_node"] == gpus


def test_more_gpus_than_the_machine_has_are_refused() -> None:
    resolved = resolve({**TRAIN, "resources": {"gpus_per_node": 2}}, "local")
    with pytest.raises(SlurmkitError) as refused:
        local_checks.check(resolved, gpus_here=1)
    assert str(refused.value.where).endswith(":resources")
    local_checks.check(resolved, gpus_here=2)  # as many as there are: fine


def test_a_train_run_that_asks_no_gpu_of_a_gpu_machine_is_told(capsys: pytest.CaptureFixture[str]) -> None:
    local_checks.check(resolve(TRAIN, "local"), gpus_here=0)
    assert "gpus_per_node" not in capsys.readouterr().err
    local_checks.check(resolve(TRAIN, "local"), gpus_here=4)
    assert "resources.gpus_per_node=4" in capsys.readouterr().err
    local_checks.check(resolve({"name": "c", "command": "true"}, "local"), gpus_here=4)  # not a train run
    assert "gpus_per_node" not in capsys.readouterr().err


def test_the_machines_gpus_are_counted_from_the_drivers_folder(tmp_path: Path) -> None:
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        (tmp_path / bus).mkdir()
    assert local_checks.local_gpu_count(tmp_path) == 2
    assert local_checks.local_gpu_count(tmp_path / "absent") == 0  # no driver: no GPU
