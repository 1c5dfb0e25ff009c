"""A `command` run on one rank: `bash -c` with the ranks' interpreter first on PATH and the env://
variables, its output echoed to the rank's log, and its stop.

The stop: the profile's signal or SIGTERM reaches this process as Interrupted (interrupt). A
command whose script has made a slurmkit.Checkpoint has announced it in its marker
(markers.CommandStop): it is not terminated; the signal is passed on to it (its Checkpoint only sets
a flag), and this process waits while its ranks agree on a step, save it and exit. The step it
stopped at comes back as AgreedStop, which the run's entry acts on as for a function (rank 0
records the stop, the job's supervisor requeues); one that finished its work meanwhile (exit 0, no
step) has completed. A command without one is terminated, as SIGINT would, and the stop goes on as
Interrupted.

The command starts with the requeue signal ignored (its ranks' Checkpoint puts its own handler in):
Slurm delivers a step's signals to every process of the step, and a launcher of the command's own
(`command: torchrun ... train.py`) would die of USR1 or USR2, its default action, under its ranks'
save. A command that handles nothing is terminated by its worker as before.
"""

from __future__ import annotations

import codecs
import os
import select
import signal
import subprocess
import sys
from collections import deque
from pathlib import Path

from slurmkit.common.markers import COMMAND_STOP_ENV, CommandStop
from slurmkit.jsontypes import JsonObject
from slurmkit.supervisor.signal_inbox import SignalInbox
from slurmkit.worker.ft.stop import AgreedStop, requeue_signal
from slurmkit.worker.interrupt import Interrupted
from slurmkit.worker.process_group import detect, rank_env

STDOUT_TAIL_LINES = 200
CHUNK_BYTES = 65536
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


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=COMMAND_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()


class _Deferred(SignalInbox):
    """The stop signals' Python handlers (interrupt's, which raise Interrupted, or submitit's) run
    where the echo asks (`run_pending`), not wherever the signal lands: raised between reading a
    chunk of the command's output and writing it, an exception lost that chunk (a rank's
    `step=21` line went missing at a preemption)."""

    def __init__(self, signums: tuple[int, ...]) -> None:
        self.saved = {s: h for s in signums if callable(h := signal.getsignal(s))}
        super().__init__(tuple(self.saved))

    def run_pending(self) -> None:
        """Run the handlers of the signals that came, in order; one may raise, as at the signal."""
        taken = self.take()
        while taken:
            signum = taken.pop(0)
            try:
                self.saved[signum](signum, None)
            except BaseException:
                self._pending[:0] = taken  # not run yet: still pending, for the next call or the exit
                raise

    def __exit__(self, *exc: object) -> None:
        left = self.left
        super().__exit__(*exc)
        for signum in left:  # came after the last run_pending: to their own handlers now
            signal.raise_signal(signum)


def _echo(proc: subprocess.Popen[bytes], tail: deque[str], marker: Path) -> Interrupted | None:
    """Echo the command's output until it closes it; the stop signal that came meanwhile, if any.
    A command that has announced its slurmkit.Checkpoint is sent the signal and read on; any other
    is terminated and the stop raised. Every byte read is written: signals are acted on between chunks."""
    assert proc.stdout is not None
    out, decode, partial = proc.stdout.fileno(), codecs.getincrementaldecoder("utf-8")("replace").decode, ""
    asked: Interrupted | None = None
    with _Deferred((int(requeue_signal()), int(signal.SIGTERM))) as deferred:
        try:
            while True:
                ready = select.select([out, deferred.fd], [], [])[0]
                try:
                    deferred.run_pending()
                except Interrupted as stop:
                    if CommandStop.read(marker) is None:
                        raise
                    proc.send_signal(_stop_signal(stop))  # the step's signal may not have reached it: say it once more
                    asked = stop if asked is None or not stop.requeue else asked
                if out not in ready:
                    continue
                data = os.read(out, CHUNK_BYTES)
                text = decode(data, not data)
                sys.stdout.write(text)
                sys.stdout.flush()
                *lines, partial = (partial + text).split("\n")
                tail.extend(line + "\n" for line in lines)
                partial = partial[-CHUNK_BYTES:]  # a line that never ends (a progress bar's \r) keeps its end
                if not data:  # the command closed its output: it ended, or is ending
                    tail.extend([partial] if partial else [])
                    return asked
        except BaseException:
            _terminate(proc)
            raise


def run_command(command: str, marker: Path) -> JsonObject:
    """Run with bash -c (with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and
    LOCAL_WORLD_SIZE exported), echo its output to the rank log as it comes, return its tail.
    `marker`: this rank's CommandStop file (markers.CommandStop.prepared)."""
    tail: deque[str] = deque(maxlen=STDOUT_TAIL_LINES)
    # The env:// rendezvous variables, so that a user's own `python train.py` with
    # init_process_group() works under srun without slurmkit's worker.
    env = {**os.environ, **rank_env(detect()), "PATH": own_python_first(os.environ.get("PATH", "")),
           COMMAND_STOP_ENV: str(marker)}
    shielded = f"trap '' {requeue_signal().name[3:]}\n{command}"  # ignored stays ignored across exec
    with subprocess.Popen(["bash", "-c", shielded], stdout=subprocess.PIPE, stderr=None, env=env) as proc:
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
