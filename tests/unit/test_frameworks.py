"""A Lightning script with no line of slurmkit in it, run as a command on the local profile (two
ranks, gloo): the profile's signal to one rank stops both at one agreed batch, where Lightning's own
hpc checkpoint is saved (docs/frameworks.md). The requeue and the resume under Slurm are
tests/cluster/test_cluster_frameworks.py's."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import torch

import slurmkit
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import CommandStop, Stragglers
from slurmkit.common.metrics import iter_records, read_records
from slurmkit.runs import procs
from slurmkit.worker.frameworks import lightning as lightning_hook
from tests.conftest import USER_CODE, slow_down, wait_until
from tests.unit.test_command_stop import ranks_script_pid


def test_the_factories_give_nothing_outside_a_slurmkit_command(lightning: Path) -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from slurmkit.worker.frameworks import lightning as h; "
            "print(h.pytorch_lightning_callbacks())")
    out = subprocess.run([sys.executable, "-c", code, str(lightning)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert lightning_hook.lightning_callbacks() == []  # this process is no command's rank either


def test_a_signalled_lightning_script_stops_at_one_agreed_batch_with_its_hpc_checkpoint(
        local_once: Path, lightning: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    job = slurmkit.Executor(profile=str(local_once), tasks_per_node=2, name="lit",
                            env={"PYTHONPATH": str(lightning)}).submit_command(
        ["python", str(USER_CODE / "lightning_toy.py"), "--steps", "100000", "--devices", "2",
         "--step-time", "0.01", "--root", str(root)])
    paths = RunPaths(Path(job.run_dir))
    log = paths.rank_log(job.job_id, 0)
    wait_until(lambda: log.exists() and "step=30 " in log.read_text(), 180, "step 30", poll_s=0.2)
    pid = ranks_script_pid(paths.command_stop(job.job_id, 1), "lightning_toy.py")
    assert pid is not None
    os.kill(pid, signal.SIGUSR2)  # the local profile's signal to one rank: both stop, at the same batch
    job.wait(timeout=120)
    stops = [CommandStop.read(paths.command_stop(job.job_id, rank)) for rank in (0, 1)]
    assert stops[0] is not None and stops[0].step is not None and stops[0].requeue
    assert stops[0] == stops[1]
    saved = torch.load(root / "hpc_ckpt_1.ckpt", weights_only=False)
    assert saved["global_step"] == stops[0].step  # Lightning's own checkpoint, of the agreed step
    logged = read_records(paths.logged)  # what the module logged (self.log), every log_every_n_steps
    assert logged and all(r["step"] % 10 == 0 and "train_loss" in r for r in logged)
    last = [int(m) for m in re.findall(r"rank=0 step=(\d+) ", log.read_text())][-1]
    assert last == stops[0].step  # no batch ran past it


def test_a_lightning_scripts_rank_slowed_from_outside_is_named_from_the_callbacks_scores(
        local_once: Path, lightning: Path) -> None:
    """The unmodified script's rank 1 stopped 2/3 of the time (SIGSTOP/SIGCONT): the callback times
    each rank's batches less its stop vote's wait, the ranks all-gather their medians over the
    vote's group at a boundary the vote agreed on, and rank 0 names rank 1."""
    job = slurmkit.Executor(profile=str(local_once), tasks_per_node=2, name="litslow",
                            env={"PYTHONPATH": str(lightning), "SLURMKIT_STRAGGLER_PERIOD_S": "0.5"}).submit_command(
        ["python", str(USER_CODE / "lightning_toy.py"), "--steps", "100000", "--devices", "2",
         "--step-time", "0.01"])
    paths = RunPaths(Path(job.run_dir))
    wait_until(lambda: ranks_script_pid(paths.command_stop(job.job_id, 1), "lightning_toy.py") is not None, 180,
               "rank 1's script", poll_s=0.2)
    pid = ranks_script_pid(paths.command_stop(job.job_id, 1), "lightning_toy.py") or 0
    try:
        slow_down(pid, lambda: bool(Stragglers.read(paths)), looks=40)
    finally:
        job.cancel()
    (named,) = Stragglers.read(paths)
    assert named.rank == 1 and named.score < 0.7
    assert any(r["slowest"][0][0] == 1 for r in iter_records(paths.straggler_scores))
    lowest = [r["straggler_score_min"] for r in read_records(paths.logged) if "straggler_score_min" in r]
    assert lowest and min(lowest) < 0.7  # in what the run's trackers get, beside the module's own values


def test_a_lightning_script_that_goes_on_after_fit_is_ended_by_a_local_cancel(
        local_once: Path, lightning: Path, tmp_path: Path) -> None:
    job = slurmkit.Executor(profile=str(local_once), tasks_per_node=2, name="litafter",
                            env={"PYTHONPATH": str(lightning)}).submit_command(
        ["python", str(USER_CODE / "lightning_toy.py"), "--steps", "5", "--devices", "2", "--root",
         str(tmp_path / "root"), "--after-fit-s", "3600"])
    paths = RunPaths(Path(job.run_dir))
    logs = [paths.rank_log(job.job_id, rank) for rank in (0, 1)]
    wait_until(lambda: all(log.exists() and " done " in log.read_text() for log in logs), 300, "fit done on both ranks",
               poll_s=0.2)
    pids = [int(re.findall(r" done global_step=\d+ pid=(\d+)", log.read_text())[0]) for log in logs]
    # After fit, nothing reads the callback's flag: the signal does what it did before.
    assert all(not paths.command_stop(job.job_id, rank).exists() for rank in (0, 1)), "no longer agrees stops"
    assert job.cancel() == [job.job_id]
    assert [procs.pid_alive(pid) for pid in pids] == [False, False], "cancel returns once the job's group is gone"
    assert not procs.group_alive(int(job.job_id))


def test_a_signalled_hf_trainer_with_the_callback_saves_the_agreed_step_and_ends(
        local_once: Path, huggingface: Path, tmp_path: Path) -> None:
    """tests/user_code/hf_toy.py with its two marked lines (slurmkit.huggingface.AgreedStop): both
    ranks stop at one step, and the Trainer's own checkpoint-N of that step is what
    get_last_checkpoint finds next time."""
    out = tmp_path / "out"
    job = slurmkit.Executor(profile=str(local_once), tasks_per_node=2, name="hf",
                            env={"PYTHONPATH": str(huggingface)}).submit_command(
        ["python", str(USER_CODE / "hf_toy.py"), "--steps", "100000", "--save-steps", "100000", "--out", str(out),
         "--slurmkit"])
    paths = RunPaths(Path(job.run_dir))
    log = paths.rank_log(job.job_id, 0)
    wait_until(lambda: log.exists() and "step=30 " in log.read_text(), 180, "step 30", poll_s=0.2)
    pid = ranks_script_pid(paths.command_stop(job.job_id, 1), "hf_toy.py")
    assert pid is not None
    os.kill(pid, signal.SIGUSR2)
    job.wait(timeout=120)
    stops = [CommandStop.read(paths.command_stop(job.job_id, rank)) for rank in (0, 1)]
    assert stops[0] is not None and stops[0].step is not None and stops[0].requeue and stops[0] == stops[1]
    assert sorted(p.name for p in out.iterdir()) == [f"checkpoint-{stops[0].step}"]
    state = json.loads((out / f"checkpoint-{stops[0].step}" / "trainer_state.json").read_text())
    assert state["global_step"] == stops[0].step
    logged = read_records(paths.logged)  # what the Trainer logged, every logging_steps (10)
    assert logged and all(r["step"] % 10 == 0 and "loss" in r for r in logged)
    last = [int(m) for m in re.findall(r"rank=0 step=(\d+) ", log.read_text())][-1]
    assert last == stops[0].step
