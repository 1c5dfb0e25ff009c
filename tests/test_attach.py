"""`slurmkit attach`'s Slurm step, without a cluster (the shell itself: tests/test_cluster_live.py)."""

from __future__ import annotations

import pytest

from slurmkit.common.trust import NotOwnError
from slurmkit.slurm import commands


def test_attach_is_one_overlapping_step_with_a_terminal_on_the_ranks_node_in_the_run_folder() -> None:
    argv = commands.attach_argv("4711", "node2", "/runs/a b")
    assert argv[:3] == ["srun", "--overlap", "--jobid=4711"]
    assert argv[argv.index("-w") + 1] == "node2" and "--pty" in argv and "--chdir=/runs/a b" in argv
    assert argv[-2:] == ["bash", "-i"]


@pytest.mark.parametrize("job_id", ["--uid=0", "4711 --pty", ""])
def test_a_job_id_that_is_not_one_never_reaches_srun(job_id: str) -> None:
    with pytest.raises(NotOwnError):
        commands.attach_argv(job_id, "node2", "/runs/x")
