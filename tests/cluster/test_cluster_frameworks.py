"""The frameworks users already run, installed from the package index at test time (nothing
vendored), run as commands on the dev cluster with not a line of slurmkit in them: each gets the
agreed stop, one requeue, and resumes with no finished step run twice (docs/frameworks.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.slurm import commands
from tests.cluster.test_cluster_jobs import _rank0_steps, finish, submit
from tests.conftest import USER_CODE, wait_until, write_spec

pytestmark = pytest.mark.cluster


def test_an_unmodified_lightning_script_preempted_resumes_where_it_stopped_after_one_requeue(
        cluster: None, tmp_path: Path, dev_profile: Path, lightning: Path) -> None:
    """tests/user_code/lightning_toy.py, a LightningModule and `Trainer(num_nodes=2, devices=1,
    strategy="ddp", max_steps=...)`, as a command on 2 nodes. Preempted (the profile's signal, which
    Lightning's own handler does not take), its ranks stop at one agreed step and save Lightning's
    hpc checkpoint; the job's supervisor requeues it once (Slurm counts one restart: Lightning's
    own scontrol requeue never ran), and Lightning resumes from that checkpoint."""
    steps, root = 200, tmp_path / "lightning-root"
    spec = write_spec(tmp_path, name="lightning", resources={"nodes": 2, "tasks_per_node": 1, "time": "00:10:00"},
                      command=f"python {USER_CODE / 'lightning_toy.py'} --steps {steps} --nodes 2 --step-time 0.02 "
                              f"--root {root}", env={"PYTHONPATH": str(lightning)})
    sub = submit(spec, dev_profile)
    paths, job_id = RunPaths(Path(sub["run_dir"])), sub["job_id"]
    log = paths.rank_log(job_id, 0)
    wait_until(lambda: log.exists() and len(_rank0_steps(paths, job_id)) >= 50, 240, "step 50", poll_s=0.2)
    commands.run(["scancel", "--batch", "--signal=USR2", job_id])  # the supervisor passes it on to the ranks
    status = finish(sub["run_dir"], timeout_s=400)
    assert status.state == "COMPLETED" and status.restarts == 1
    record = RunFile(paths).read()
    assert [(r.kind, r.cause) for r in record.restarts] == [("requeue", "preemption")]
    saved = sorted(p.name for p in root.iterdir())
    assert saved == ["hpc_ckpt_1.ckpt"]  # one save, at the agreed stop
    done = _rank0_steps(paths, job_id)
    assert done == list(range(1, steps + 1))  # no step lost, none run twice (the issue allows 1 %)
    text = log.read_text()
    assert text.count(f"rank=0 done global_step={steps}") == 1


ACCELERATE = "python -m accelerate.commands.launch --mixed_precision no --dynamo_backend no"
ACCELERATE_TORCHRUN = (f"{ACCELERATE} --multi_gpu --num_processes 4 --num_machines 2 --machine_rank $SLURM_NODEID "
                       "--main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT --rdzv_backend c10d")
"""accelerate's multi-node launch (torch's elastic launcher underneath: 2 ranks a node); --multi_gpu
is accelerate's word for "several processes", on CPU too."""


@pytest.mark.parametrize("launch", [f"{ACCELERATE} --num_processes 1", ACCELERATE_TORCHRUN],
                         ids=["accelerate-under-srun", "accelerate-torchrun"])
def test_an_hf_trainer_with_the_callback_preempted_resumes_at_the_agreed_step(
        cluster: None, tmp_path: Path, dev_profile: Path, huggingface: Path, launch: str) -> None:
    """tests/user_code/hf_toy.py (a tiny GPT-2 from a config, the usual get_last_checkpoint resume)
    with its two marked lines, started by `accelerate launch` on 2 nodes: one process an srun task,
    or accelerate's own multi-node launch of 2 a node. Preempted, its ranks save the agreed step as
    the Trainer's own checkpoint-N, the supervisor requeues once, and the next incarnation resumes
    there: every step ran once, where save_steps alone would have lost those since its last save."""
    steps, out = 100, tmp_path / "out"
    spec = write_spec(tmp_path, name="hf", resources={"nodes": 2, "tasks_per_node": 1, "time": "00:10:00"},
                      command=f"{launch} {USER_CODE / 'hf_toy.py'} --steps {steps} --save-steps 1000 --out {out} "
                              "--slurmkit", env={"PYTHONPATH": str(huggingface)})
    sub = submit(spec, dev_profile)
    paths, job_id = RunPaths(Path(sub["run_dir"])), sub["job_id"]
    log = paths.rank_log(job_id, 0)
    wait_until(lambda: log.exists() and len(_rank0_steps(paths, job_id)) >= 40, 240, "step 40", poll_s=0.2)
    commands.run(["scancel", "--batch", "--signal=USR2", job_id])
    status = finish(sub["run_dir"], timeout_s=400)
    assert status.state == "COMPLETED" and status.restarts == 1
    assert [(r.kind, r.cause) for r in RunFile(paths).read().restarts] == [("requeue", "preemption")]
    done = _rank0_steps(paths, job_id)
    assert done == list(range(1, steps + 1))  # none lost, none run twice
    saved = sorted(int(p.name.split("-")[1]) for p in out.iterdir())
    assert len(saved) == 2 and 40 <= saved[0] < steps and saved[1] == steps  # the agreed step's, the final one
    assert log.read_text().count(f"rank=0 done global_step={steps}") == 1
