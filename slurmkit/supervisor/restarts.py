"""The restart entries of run.json: what started each incarnation and each in-job step, its cause
and its cost.

The cause is what is known for sure: the marker the requester wrote before asking Slurm to
requeue (restart-request.json), or else what Slurm reports for the previous incarnation (sacct:
NODE_FAIL, PREEMPTED, TIMEOUT, REQUEUED). Each cause has its own budget in the profile's `requeue`
block; the profile's requeue.in_job bounds the in-job restarts (warm and cold) of one incarnation.
The budget arithmetic itself is RunRecord's (budget, spent, left, allowed, in_job_left).
"""

from __future__ import annotations

import datetime as dt

from slurmkit.common.cause import Cause
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import RestartRequest, StopMarker
from slurmkit.common.metrics import last_record
from slurmkit.common.record import RestartEntry, RunFile
from slurmkit.slurm import commands

SLURM_STATE_CAUSE = {"NODE_FAIL": Cause.NODE_FAILURE, "PREEMPTED": Cause.PREEMPTION, "TIMEOUT": Cause.TIMEOUT,
                     "REQUEUED": Cause.REQUEUE, "REQUEUE_HOLD": Cause.REQUEUE, "FAILED": Cause.CRASH}


def now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


def marker(paths: RunPaths, job_id: str, restart_count: int) -> RestartRequest | None:
    """The restart request incarnation `restart_count` of the job left before asking Slurm
    (effects.requeue), if it is readable; one from another incarnation or job is stale."""
    return RestartRequest.read(paths, job_id, restart_count)


def restart_cause(paths: RunPaths, job_id: str, restart_count: int) -> tuple[Cause, str]:
    """The marker the previous incarnation's requester left, else what accounting says that
    incarnation ended as."""
    found = marker(paths, job_id, restart_count - 1)
    if found is not None:
        return found.cause, found.detail
    return cause_of_previous(commands.incarnation_states(job_id))


def cause_of_previous(states: list[str]) -> tuple[Cause, str]:
    """(cause, detail) of a restart from accounting: how the incarnation before the current one ended."""
    previous = states[-2] if len(states) >= 2 else ""
    detail = f"slurm state {previous}" if previous else "no marker and no accounting record"
    return SLURM_STATE_CAUSE.get(previous, Cause.UNKNOWN), detail


def record_restart(paths: RunPaths, job_id: str, restart_count: int, resumed_step: int | None) -> RestartEntry:
    """On start of incarnation N > 0: append the restart and its cause to run.json (once), under its lock."""
    done = RunFile(paths).read().started_by(job_id, restart_count)
    if done:
        return done
    cause, detail = restart_cause(paths, job_id, restart_count)  # before the lock: it may ask sacct
    lost = lost_steps(paths, resumed_step)
    with RunFile(paths).editing() as record:
        entry = record.started_by(job_id, restart_count)
        if entry is None:
            entry = RestartEntry(kind="requeue", n=restart_count, job_id=job_id, cause=cause, detail=detail, time=now(),
                                 resumed_step=resumed_step, lost_steps=lost)
            record.restarts.append(entry)
            if record.spent(cause) > record.budget(cause):
                record.final = f"{cause} budget of {record.budget(cause)} spent"
    RestartRequest.clear(paths)
    StopMarker.clear(paths)
    return entry


def note_resumed(paths: RunPaths, job_id: str, restart_count: int, attempt: int,
                 resumed_step: int | None) -> RestartEntry | None:
    """Rank 0 of a start that the login node or the supervisor recorded before it ran (a resubmitted
    job's restart 0; an in-job restart): its entry learns the step it resumed from and the steps
    that run again. The entry, or None if there is none."""
    entry = RunFile(paths).read().started_by(job_id, restart_count, attempt)
    if entry is None or entry.resumed_step is not None:
        return entry
    lost = lost_steps(paths, resumed_step)
    with RunFile(paths).editing() as record:
        entry = record.started_by(job_id, restart_count, attempt)
        if entry is not None:
            entry.resumed_step, entry.lost_steps = resumed_step, lost
    StopMarker.clear(paths)
    return entry


def lost_steps(paths: RunPaths, resumed_step: int | None) -> int | None:
    """Steps the last incarnation ran past the checkpoint this one resumes from: they run again.
    0 when the stop's save made it (within GraceTime or KillWait); None before any step ran."""
    reached = [s for s in (last_step(paths), _stop_step(paths)) if s is not None]
    return max(0, max(reached) - (resumed_step or 0)) if reached else None


def _stop_step(paths: RunPaths) -> int | None:
    """The stop step of the last incarnation (its marker): its metrics record may never have been written."""
    found = StopMarker.read(paths)
    return None if found is None else found.step


def last_step(paths: RunPaths) -> int | None:
    record = last_record(paths.metrics)
    return int(record["step"]) if record and "step" in record else None
