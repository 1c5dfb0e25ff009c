"""A command run's own script with a slurmkit.Checkpoint (tests/user_code/ddp_toy_resumable.py: the
user's DDP script plus the lines marked `# slurmkit: N`): the stop signal only sets its flag, its
ranks stop at one agreed step and save it (issue 33, item 3). Local profile, two ranks, gloo; the
requeue and the resume under Slurm are tests/test_cluster_jobs.py's."""

from __future__ import annotations

import difflib
import os
import re
import shlex
import signal
from pathlib import Path

import slurmkit
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import COMMAND_STOP_ENV, CommandStop
from slurmkit.worker.checkpoint import STATE_FILE
from slurmkit.worker.ckptstore import CheckpointStore
from tests.test_cluster_faults import wait_until

USER_CODE = Path(__file__).parent / "user_code"


def test_the_lines_a_user_adds_are_ten_and_marked() -> None:
    """docs/fault-tolerance.md promises ten lines: every line the resumable script adds or changes
    (its header aside) carries its `# slurmkit: N` mark, or continues the statement before it."""
    plain = (USER_CODE / "ddp_toy.py").read_text().splitlines()
    resumable = (USER_CODE / "ddp_toy_resumable.py").read_text().splitlines()
    changed = [ln for ln in difflib.ndiff(plain, resumable) if ln.startswith("+ ") and not ln.startswith("+ #")]
    marks = [int(m) for ln in changed for m in re.findall(r"# slurmkit: (\d+)", ln)]
    assert marks == list(range(1, 11))
    unmarked = [ln for ln in changed if "# slurmkit:" not in ln and ln.strip("+ ")]
    assert unmarked == ['+                           "step": i + 1}, rank_state=gen.get_state())']
    doc = (Path(__file__).parent.parent / "docs" / "fault-tolerance.md").read_text()
    assert all(ln[2:].split("  # slurmkit")[0].strip() in doc for ln in changed if ln.strip("+ "))


def ranks_script_pid(marker: Path) -> int | None:
    """The user's script process (python ddp_toy_resumable.py) the rank's worker handed `marker` to
    (the dev cluster's nodes share this machine's /proc)."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"ddp_toy_resumable.py") for a in argv) and f"{COMMAND_STOP_ENV}={marker}".encode() in env:
            return int(entry.name)
    return None


def test_a_signalled_script_stops_at_one_agreed_step_saved_on_every_rank(local_profile: Path) -> None:
    job = slurmkit.Executor(profile=str(local_profile), tasks_per_node=2, name="resumable").submit_command(
        ["python", str(USER_CODE / "ddp_toy_resumable.py"), "--steps", "100000", "--step-time", "0.01"])
    paths = RunPaths(Path(job.run_dir))
    log = paths.rank_log(job.job_id, 0)
    wait_until(lambda: log.exists() and "step=30 " in log.read_text(), 120, "step 30", poll_s=0.2)
    pid = ranks_script_pid(paths.command_stop(job.job_id, 1))
    assert pid is not None
    os.kill(pid, signal.SIGUSR2)  # one rank's signal: both stop, at the same step
    job.wait(timeout=120)
    stops = [CommandStop.read(paths.command_stop(job.job_id, rank)) for rank in (0, 1)]
    assert stops[0] is not None and stops[0].step is not None and stops[0].requeue
    assert stops[0] == stops[1]
    store = CheckpointStore(paths.checkpoint_uri(None), (STATE_FILE,))
    assert store.latest_valid() == stops[0].step  # its save committed before the script ended
    last = [int(m) for m in re.findall(r"rank=0 step=(\d+) ", log.read_text())][-1]
    assert last == stops[0].step  # no step ran past the agreed one


def _command_processes(marker: Path) -> dict[int, bytes]:
    """The processes of a command run's rank (the marker's variable in their environment): pid -> argv."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{COMMAND_STOP_ENV}={marker}".encode() in env:
            found[int(entry.name)] = argv
    return found


def test_torchrun_inside_the_command_outlives_the_signal_and_its_ranks_stop_at_one_step(local_profile: Path) -> None:
    """`command: torchrun ... train.py` (the launcher inside the user's command, not slurmkit's): the
    requeue signal reaches every process of the command, torchrun included, as Slurm sends it. torchrun
    ignores it (it would die of it, its ranks with it), the script's two ranks agree on a step, save it
    and end, torchrun exits 0. (The rank's own worker is a submitit local job here, whose handler the
    signal is not sent to: under Slurm it passes the signal on, as tests/test_cluster_jobs.py checks.)"""
    torchrun = shlex.join(["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(USER_CODE / "ddp_toy_resumable.py"), "--steps", "100000", "--step-time", "0.01"])
    job = slurmkit.Executor(profile=str(local_profile), tasks_per_node=1, name="torchrun-inside").submit_command(
        f'{torchrun}; echo "torchrun exited $?"')
    paths = RunPaths(Path(job.run_dir))
    log, marker = paths.rank_log(job.job_id, 0), paths.command_stop(job.job_id, 0)
    try:
        wait_until(lambda: log.exists() and "rank=1 step=30 " in log.read_text(), 120, "step 30", poll_s=0.2)
        assert CommandStop.read(marker) == CommandStop()  # announced, running
        processes = _command_processes(marker)  # the command's bash, torchrun and its two ranks
        assert sum(b"\0torch.distributed.run\0" in argv for argv in processes.values()) == 1 and len(processes) == 4
        for pid in processes:  # every one of them, as Slurm's process tracking sends it
            os.kill(pid, signal.SIGUSR2)
        job.wait(timeout=120)
    finally:
        job.cancel()  # a failed wait leaves no ranks behind
    stop = CommandStop.read(marker)
    assert stop is not None and stop.step is not None and stop.requeue
    store = CheckpointStore(paths.checkpoint_uri(None), (STATE_FILE,))
    assert store.latest_valid() == stop.step  # its save committed before the script ended
    text = log.read_text()
    assert "torchrun exited 0" in text  # it outlived the signal, and its ranks ended well
    for rank in (0, 1):  # both of torchrun's ranks ran to the agreed step, and no further
        assert [int(m) for m in re.findall(rf"rank={rank} step=(\d+) ", text)][-1] == stop.step
