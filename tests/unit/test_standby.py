"""The standby rank process without Slurm: it imports while niced, survives the requeue signal
while it waits, and on its go file runs submitit's worker in itself (the whole hand-over runs in
test_cluster_faults)."""

from __future__ import annotations

import operator
import os
import signal
import subprocess
import sys
from pathlib import Path

from submitit.core.utils import DelayedSubmission, pickle_load

from slurmkit.common.layout import RunPaths


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_a_standby_waits_niced_through_the_requeue_signal_then_runs_submitits_worker(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    paths.run_dir.mkdir()
    folder = tmp_path / "submitit"
    folder.mkdir()
    DelayedSubmission(operator.add, 2, 3).dump(folder / "7_submitted.pkl")
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1", "SLURMKIT_SIGNAL": "USR2",
           "SLURMKIT_ATTEMPT": "0", "SUBMITIT_EXECUTOR": "slurm", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
           "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "node1"}
    proc = subprocess.Popen([sys.executable, "-u", "-m", "slurmkit.worker.standby", "--run-dir", str(paths.run_dir),
                             str(folder), "--attempt", "1"], env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        line = proc.stderr.readline()
        assert "standby rank for in-job attempt 1 ready" in line, line
        # while it waits the running ranks keep the CPUs (the kernel caps niceness at 19: a niced test run)
        assert _nice(proc.pid) == min(_nice(os.getpid()) + 10, 19) > _nice(os.getpid())
        proc.send_signal(signal.SIGUSR2)  # Slurm signals every step: not this one's to act on
        paths.standby_go("7", 0, 1).touch()  # the previous incarnation's attempt 1: not this one's
        paths.standby_go("7", 1, 1).touch()
        out, rest = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert "standby rank takes in-job attempt 1" in rest and proc.returncode == 0, rest
    # submitit's worker ran the job in the process, as a fresh rank would.
    assert pickle_load(folder / "7_0_result.pkl") == ("success", 5)
