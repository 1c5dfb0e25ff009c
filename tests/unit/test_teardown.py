"""The end of a clean run: the rank that hosts the store (rank 0) leaves only after the others'
groups are gone. Two real gloo ranks on this machine, under each launcher that makes its own store.

CI once saw rank 1 never return from its teardown after rank 0 had exited, which a teardown that
still talks to the store would do; here rank 1's teardown is slowed so the order shows.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.test_agreement import run_two_ranks, torchrun_env

RANK_CODE = """
import pathlib, sys, time
import torch.distributed as tdist
from slurmkit.worker.process_group import distributed

out = pathlib.Path(sys.argv[1])
real_destroy = tdist.destroy_process_group

def slow_destroy(*args, **kwargs):
    rank = tdist.get_rank()
    if rank == 1:
        time.sleep(2)  # rank 1's teardown is the slow one
    real_destroy(*args, **kwargs)
    if rank == 1:
        (out / "rank1-destroyed").write_text("")

tdist.destroy_process_group = slow_destroy
with distributed() as dist:
    rank = dist.rank
(out / f"rank{rank}-left").write_text(str((out / "rank1-destroyed").exists()))
"""


def submitit_local_env(rank: int, port: int) -> dict[str, str]:
    """What submitit's local executor sets for one of two ranks: slurmkit's own Group and store."""
    return {"SUBMITIT_LOCAL_GLOBALID": str(rank), "SUBMITIT_LOCAL_LOCALID": str(rank), "SUBMITIT_LOCAL_NTASKS": "2",
            "SUBMITIT_LOCAL_JOB_ID": "1", "MASTER_PORT": str(port)}


@pytest.mark.parametrize("rank_env", [submitit_local_env, torchrun_env], ids=["local", "torchrun"])
def test_rank_0_leaves_after_the_others_groups_are_gone(rank_env: Callable[[int, int], dict[str, str]],
                                                        tmp_path: Path) -> None:
    run_two_ranks(RANK_CODE, [str(tmp_path)], rank_env)
    assert (tmp_path / "rank0-left").read_text() == "True"  # rank 1's group was gone before rank 0 left
    assert (tmp_path / "rank1-left").read_text() == "True"


WATCHED = """
import sys, time
from slurmkit.worker import at_exit, rank
if sys.argv[1] == "rank":
    at_exit.mark_rank_process()
rank.EXIT_WATCH_S = 0.2
rank.watch_the_way_out()
if sys.argv[2] == "finish":
    rank.finish(0)  # got there: the watch is off
time.sleep(2)  # a way out that hangs
"""


@pytest.mark.parametrize("process, then, dumped", [("rank", "hang", True), ("rank", "finish", False),
                                                    ("test", "hang", False)])
def test_a_rank_that_hangs_on_its_way_out_logs_its_stacks(process: str, then: str, dumped: bool) -> None:
    """After a task's last line (train_task.run), a rank process that does not reach its exit
    within EXIT_WATCH_S writes every thread's stack to its log; one that reaches it does not, and
    neither does a process that is no rank (a test calling a task itself)."""
    proc = subprocess.run([sys.executable, "-P", "-c", WATCHED, process, then], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert ("most recent call first" in proc.stderr) is dumped


PENDING = """
import pathlib, sys, time, torch
import torch.distributed as tdist
from slurmkit.worker import at_exit

out = pathlib.Path(sys.argv[1])
tdist.init_process_group("gloo")
# A worker thread is known by the name it gives itself once it runs; on a busy machine it may not
# have run yet right after init (CI saw that), so one collective first, as any run has done by its exit.
tdist.all_reduce(torch.ones(1))
if tdist.get_rank() == 0:
    work = tdist.all_reduce(torch.ones(1000), async_op=True)  # rank 1 joins only once told
    (out / "busy").write_text(str(at_exit.wait_gloo_idle(1.0)))
    (out / "go").write_text("")
    work.wait()
    (out / "idle").write_text(str(at_exit.wait_gloo_idle(300.0)))
else:
    while not (out / "go").exists():
        time.sleep(0.05)
    tdist.all_reduce(torch.ones(1000))
tdist.destroy_process_group()
"""


def test_the_exit_handler_tells_a_gloo_worker_at_work_from_one_waiting_for_work(tmp_path: Path) -> None:
    """at_exit.wait_gloo_idle, which the exit handler sleeps in: not idle while rank 0's worker holds a
    collective its peer has not joined; idle once it has run and been freed."""
    run_two_ranks(PENDING, [str(tmp_path)])
    assert (tmp_path / "busy").read_text() == "False"
    assert (tmp_path / "idle").read_text() == "True"
