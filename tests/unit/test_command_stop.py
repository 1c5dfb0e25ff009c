"""A command run's own script with a slurmkit.Checkpoint (tests/user_code/ddp_toy_resumable.py: the
user's DDP script plus the lines marked `# slurmkit: N`): the stop signal only sets its flag, its
ranks stop at one agreed step and save it (issue 33, item 3). Local profile, two ranks, gloo; the
requeue and the resume under Slurm are tests/cluster/test_cluster_jobs.py's."""

from __future__ import annotations

import difflib
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

import slurmkit
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import COMMAND_STOP_ENV, CommandStop
from slurmkit.worker.checkpoint import STATE_FILE
from slurmkit.worker.checkpoint.store import CheckpointStore
from slurmkit.worker.command import run_command
from slurmkit.worker.ft.stop import install_handlers
from slurmkit.worker.interrupt import _raising_handler
from tests.conftest import wait_until

USER_CODE = Path(__file__).parents[1] / "user_code"


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
    doc = (Path(__file__).parents[2] / "docs" / "fault-tolerance.md").read_text()
    assert all(ln[2:].split("  # slurmkit")[0].strip() in doc for ln in changed if ln.strip("+ "))


def ranks_script_pid(marker: Path, script: str = "ddp_toy_resumable.py") -> int | None:
    """The user's script process (python `script`) the rank's worker handed `marker` to (the dev
    cluster's nodes share this machine's /proc)."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(script.encode()) for a in argv) and f"{COMMAND_STOP_ENV}={marker}".encode() in env:
            return int(entry.name)
    return None


def test_a_signalled_script_stops_at_one_agreed_step_saved_on_every_rank(local_once: Path) -> None:
    job = slurmkit.Executor(profile=str(local_once), tasks_per_node=2, name="resumable").submit_command(
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


def test_a_launcher_in_the_command_outlives_the_requeue_signal_its_ranks_act_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`command: torchrun ... train.py`: Slurm signals every process of the step, torchrun included,
    whose default action for USR2 is to die (and its store with it) under its ranks' save. The
    command starts with the requeue signal ignored; a program that wants it puts its handler in."""
    monkeypatch.setenv("SLURMKIT_SIGNAL", "USR2")
    marker = tmp_path / "stop.json"
    handled = ("python -c 'import os, signal; signal.signal(signal.SIGUSR2, lambda *_: print(\"handled\")); "
               "os.kill(os.getpid(), signal.SIGUSR2)'")
    out = run_command(f"kill -USR2 $$; echo launcher alive; {handled}", marker)
    assert out["returncode"] == 0 and out["stdout"].split() == ["launcher", "alive", "handled"]


def test_the_echo_loses_no_line_of_the_commands_output_to_stop_signals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A rank's worker echoes its command's output while the stop signals come to it (Slurm signals
    every process of the step). Their handlers raise (interrupt), and raised between reading a
    chunk and writing it, a line was lost (a `step=21` line at a preemption, once). Here the worker
    (this process) gets the requeue signal over and over while a command with a Checkpoint (its
    marker written: the worker passes each signal on) prints numbered lines."""
    monkeypatch.setenv("SLURMKIT_SIGNAL", "USR2")
    marker, printing = tmp_path / "stop.json", tmp_path / "printing"
    CommandStop().write(marker)  # announced, as the script's slurmkit.Checkpoint does
    done, sent = threading.Event(), []

    def signals() -> None:  # while the command prints (its `printing` file exists)
        while not printing.exists() and not done.wait(0.001):
            pass
        while printing.exists() and not done.is_set():
            os.kill(os.getpid(), signal.SIGUSR2)
            sent.append(1)
            time.sleep(0.001)

    # The command counts the signals passed on to it.
    command = (f"n=0; trap 'n=$((n+1))' USR2; touch {printing}; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); "
               f"echo \"line $i\"; done; rm {printing}; sleep 0.2; echo \"passed on $n\"")
    install_handlers(_raising_handler(True), _raising_handler(False))
    thread = threading.Thread(target=signals)
    thread.start()
    try:
        out = run_command(command, marker)
    finally:
        done.set()
        thread.join()
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    echoed = capsys.readouterr().out.splitlines()
    numbers = [int(ln.split()[1]) for ln in echoed if ln.startswith("line ")]
    assert numbers == list(range(1, 20001))  # none lost
    assert echoed[-1].startswith("passed on") and int(echoed[-1].split()[-1]) >= 1 and sent  # they came, and went on
    assert out["stdout"].splitlines()[-1] == echoed[-1]
