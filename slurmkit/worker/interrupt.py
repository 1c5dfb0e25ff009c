"""Stop signals for runs without step boundaries (command, callable, ray): interrupt, requeue, exit.

`task: train` stops all ranks at an agreed step (slurmkit.worker.train.incarnation). A shell command, a
user's callable or a Ray driver has no step to wait for, so here the handler raises in the main
thread, as SIGINT's KeyboardInterrupt does. On the profile's signal (preemption or the time limit)
the job's supervisor requeues the job within the profile's budget and the work starts again in the
next allocation; on SIGTERM the run stops, and is requeued only where Slurm is preempting it. Rank 0
records the stop (ended); the supervisor decides. These handlers replace submitit's:
its USR2 handler guesses "timed out" from wall-clock time and then fails a non-checkpointable run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from slurmkit.common import outcomes
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import Stopped
from slurmkit.common.slurm_env import slurm_job_id
from slurmkit.supervisor.local_requeue import DECIDES_ENV, local_stop
from slurmkit.worker.checkpoint import AgreedStop
from slurmkit.worker.ft.stop import install_handlers


class Interrupted(BaseException):
    """Raised by the stop handlers; a BaseException so that `except Exception` in user code lets it pass."""

    def __init__(self, requeue: bool) -> None:
        super().__init__("requeue signal" if requeue else "SIGTERM")
        self.requeue = requeue


def _raising_handler(requeue: bool) -> Any:
    """A signal handler that raises Interrupted (a stop for requeue, or for good)."""
    def handler(signum: int, frame: object) -> None:
        raise Interrupted(requeue)

    return handler


@contextmanager
def requeue_on_signal(run_dir: str) -> Iterator[None]:
    """Under Slurm and the local profile: the stop signals interrupt the body; then the stop is recorded for the job's
    supervisor (ended), and the rank exits without a result.
    A function with a slurmkit.Checkpoint replaces these handlers by its flag, and stops at the
    step its ranks agree on (AgreedStop), its state saved; that is requeued the same way."""
    if os.environ.get("SUBMITIT_EXECUTOR") in ("slurm", "local"):  # the local profile rehearses Slurm's
        install_handlers(_raising_handler(True), _raising_handler(False))
    try:
        yield
    except (Interrupted, AgreedStop) as stop:
        step = stop.step if isinstance(stop, AgreedStop) else None
        line, status = ended(run_dir, step, stop.requeue)
        print(f"slurmkit: {line}", flush=True)
        raise SystemExit(status) from None  # not an exception: no result (or error) for this incarnation


def ended(run_dir: str | None, step: int | None, requeue: bool, main: bool | None = None) -> tuple[str, int]:
    """The ranks stopped on a signal (at `step`, saved): rank 0 (`main`; by default the job's task 0)
    records the step's typed end for the job's supervisor, which decides what it means; on the local
    profile rank 0 decides itself (supervisor.local_requeue). (The line to print, the rank's exit status.)"""
    at = f"stopped at step {step}" if step is not None else "stopped"
    executor = os.environ.get("SUBMITIT_EXECUTOR")
    task = os.environ.get("SLURM_PROCID" if executor == "slurm" else "SUBMITIT_LOCAL_GLOBALID", "0")
    if not (task == "0" if main is None else main):
        return f"{at}; rank 0 records the stop", 0
    local_job = os.environ.get("SUBMITIT_LOCAL_JOB_ID", "")
    if executor == "local" and os.environ.get(DECIDES_ENV) == "0":
        return f"{at}; the run's primary part decides", 0
    if executor == "local" and local_job and run_dir:
        return local_stop(RunPaths(Path(run_dir)), local_job, step, requeue)
    job_id = slurm_job_id()
    if executor != "slurm" or not job_id or not run_dir:
        return f"{at}; not under Slurm: no requeue", 0
    Stopped(job_id, outcomes.restart_count(), outcomes.attempt(), step, requeue, time.time()).write(
        RunPaths(Path(run_dir)))
    return f"{at} on {'the requeue signal' if requeue else 'SIGTERM'}; the job's supervisor decides what comes next", 0
