"""A rank's process (slurmkit.worker.rank) without Slurm: submitit's worker runs in it, and it
exits as Python would (status, traceback, atexit handlers, other threads), short of the
finalization that cost a killed rank's in-job restart 0.5-0.7 s."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from submitit.core.utils import DelayedSubmission, pickle_load

from slurmkit.build import RANK_MODULE
from slurmkit.worker import rank, torchrun_rank
from slurmkit.worker.rank import exit_status
from tests import helpers_fns

ROOT = Path(__file__).resolve().parents[2]


Ran = tuple[subprocess.CompletedProcess[str], Path, Path]


def test_the_batch_script_and_torchrun_start_the_same_rank_module() -> None:
    assert RANK_MODULE == torchrun_rank.RANK_MODULE == rank.__name__ == "slurmkit.worker.rank"


def _run_rank(tmp_path: Path, how: str, module: str = RANK_MODULE) -> Ran:
    folder, marks = tmp_path / "submitit", tmp_path / "marks"
    folder.mkdir()
    marks.mkdir()
    DelayedSubmission(helpers_fns.exits_like_a_rank, str(marks), how).dump(folder / "7_submitted.pkl")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_JOB_ID": "7", "SUBMITIT_EXECUTOR": "slurm",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "node1"}
    proc = subprocess.run([sys.executable, "-u", "-m", module, str(folder)], env=env, capture_output=True,
                          text=True, timeout=120)
    return proc, folder, marks


@pytest.mark.parametrize(("how", "status"), [("return", 0), ("raise", 1), ("exit", 3)])
def test_a_rank_exits_with_pythons_status_after_its_threads_and_atexit_but_without_finalization(
        tmp_path: Path, how: str, status: int) -> None:
    proc, folder, marks = _run_rank(tmp_path, how)
    assert proc.returncode == status, proc.stderr
    # What a normal exit does first is done: the thread still at work finished, atexit ran.
    assert {p.name for p in marks.iterdir()} == {"thread", "atexit"}, proc.stderr
    # The finalization is not: the global that only it collects was never collected.
    if how == "return":
        assert pickle_load(folder / "7_0_result.pkl") == ("success", "done")
    if how == "raise":
        kind, text = pickle_load(folder / "7_0_result.pkl")
        assert kind == "error" and "the rank's own error" in text
        assert "Traceback" in proc.stderr and "ValueError: the rank's own error" in proc.stderr


def test_submitits_own_worker_does_finalize_so_the_check_above_can_fail(tmp_path: Path) -> None:
    proc, _, marks = _run_rank(tmp_path, "return", module="submitit.core._submit")
    assert proc.returncode == 0 and {p.name for p in marks.iterdir()} == {"thread", "atexit", "finalized"}


def test_exit_status_is_pythons_for_every_systemexit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert [exit_status(c) for c in (None, 0, 3, 256 + 75)] == [0, 0, 3, 75]
    assert exit_status("a message") == 1 and capsys.readouterr().err == "a message\n"
