"""A `command` run on one rank: `bash -c` with the ranks' interpreter first on PATH and the env://
variables, its output echoed to the rank's log, and its stop.

The stop: the profile's signal or SIGTERM reaches this process as Interrupted (ft.interrupt). A
command whose script has made a slurmkit.Checkpoint has announced it in its marker
(markers.CommandStop): it is not terminated; the signal is passed on to it (its Checkpoint only sets
a flag), and this process waits while its ranks agree on a step, save it and exit. The step it
stopped at comes back as AgreedStop, which the run's entry acts on as for a function (rank 0
requeues); one that finished its work meanwhile (exit 0, no step) has completed. A command without
one is terminated, as SIGINT would, and the stop goes on as Interrupted.

The command starts with the requeue signal ignored (its ranks' Checkpoint puts its own handler in):
Slurm delivers a step's signals to every process of the step, and a launcher of the command's own
(`command: torchrun ... train.py`) would die of USR1 or USR2, its default action, under its ranks'
save. A command that handles nothing is terminated by its worker as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

from slurmkit.common.markers import COMMAND_STOP_ENV, CommandStop
from slurmkit.worker.dist import detect, rank_env
from slurmkit.worker.ft.interrupt import Interrupted
from slurmkit.worker.ft.stop import AgreedStop, requeue_signal

STDOUT_TAIL_LINES = 200
COMMAND_GRACE_S = 5.0


class CommandFailed(RuntimeError):
    """A shell command run by a rank exited non-zero."""

    def __init__(self, returncode: int, command: str) -> None:
        self.returncode = returncode
        super().__init__(f"command exited with code {returncode}: {command}")


def own_python_first(path: str) -> str:
    """PATH with this rank's interpreter's folder first, where that folder's `python` is this
    interpreter (a venv's bin/, as `activate` does): a command's `python` is the profile's, not
    whichever one the batch shell's PATH finds first (a system Python without torch)."""
    folder = os.path.dirname(sys.executable)
    python = os.path.join(folder, "python")
    if not os.path.exists(python) or not os.path.samefile(python, sys.executable):
        return path
    return os.pathsep.join([folder, *(p for p in path.split(os.pathsep) if p and p != folder)])


def _stop_signal(stop: Interrupted) -> int:
    return int(requeue_signal() if stop.requeue else signal.SIGTERM)


def _terminate(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=COMMAND_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()


def _echo(proc: subprocess.Popen[str], tail: deque[str], marker: Path) -> Interrupted | None:
    """Echo the command's output until it closes it; the stop signal that came meanwhile, if any.
    A command that has announced its slurmkit.Checkpoint is sent the signal and read on; any other
    is terminated and the stop raised."""
    assert proc.stdout is not None
    asked: Interrupted | None = None
    while True:
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                tail.append(line)
            return asked
        except Interrupted as stop:
            if CommandStop.read(marker) is None:
                _terminate(proc)
                raise
            proc.send_signal(_stop_signal(stop))  # the step's signal may not have reached it: say it once more
            asked = stop if asked is None or not stop.requeue else asked
        except BaseException:
            _terminate(proc)
            raise


def run_command(command: str, marker: Path) -> dict[str, Any]:
    """Run with bash -c (with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and
    LOCAL_WORLD_SIZE exported), echo its output to the rank log as it comes, return its tail.
    `marker`: this rank's CommandStop file (markers.CommandStop.prepared)."""
    tail: deque[str] = deque(maxlen=STDOUT_TAIL_LINES)
    # The env:// rendezvous variables, so that a user's own `python train.py` with
    # init_process_group() works under srun without slurmkit's worker.
    env = {**os.environ, **rank_env(detect()), "PATH": own_python_first(os.environ.get("PATH", "")),
           COMMAND_STOP_ENV: str(marker)}
    shielded = f"trap '' {requeue_signal().name[3:]}\n{command}"  # ignored stays ignored across exec
    with subprocess.Popen(["bash", "-c", shielded], stdout=subprocess.PIPE, stderr=None, text=True, env=env) as proc:
        asked = _echo(proc, tail, marker)
        rc = proc.wait()
    stopped = CommandStop.read(marker)
    if stopped is not None and stopped.step is not None:
        raise AgreedStop(stopped.requeue, stopped.step)
    if asked is not None and rc != 0:  # it had a Checkpoint but failed before a step was agreed: the stop goes on
        raise asked
    if rc != 0:
        raise CommandFailed(rc, command)
    return {"returncode": rc, "stdout": "".join(tail)}
