"""The restart entries of run.json: what started each incarnation and each in-job step, its cause
and its cost; and the per-cause budget arithmetic over them.

The cause is what is known for sure: the marker the requester wrote before asking Slurm to
requeue (restart-request.json), or else what Slurm reports for the previous incarnation (sacct:
NODE_FAIL, PREEMPTED, TIMEOUT, REQUEUED). Each cause has its own budget in the profile's `requeue`
block; the profile's requeue.in_job bounds the in-job restarts (warm and cold) of one incarnation.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from slurmkit.common import outcomes
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import RestartRequest, StopMarker
from slurmkit.common.metrics import last_record
from slurmkit.common.record import RestartEntry, RunRecord
from slurmkit.slurm import commands

SLURM_STATE_CAUSE = {"NODE_FAIL": "node_failure", "PREEMPTED": "preemption", "TIMEOUT": "timeout",
                     "REQUEUED": "requeue", "REQUEUE_HOLD": "requeue", "FAILED": "crash"}


def now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


def _budgets(record: dict[str, Any]) -> dict[str, Any]:
    """The profile's `requeue` block as run.json recorded it at submit."""
    return (record.get("profile") or {}).get("requeue") or {}


def budget(record: dict[str, Any], cause: str) -> int:
    budgets = _budgets(record)
    # An external `scontrol requeue` (or a restart nobody recorded a reason for) spends the
    # preemption budget: from inside the job it looks the same.
    return int(budgets.get("preemption" if cause in ("requeue", "unknown") else cause, 0))


def spent(record: dict[str, Any], cause: str) -> int:
    return sum(1 for r in record.get("restarts", []) if r.get("cause") == cause)


def allowed(record: dict[str, Any], cause: str) -> bool:
    return not record.get("final") and spent(record, cause) < budget(record, cause)


def left(record: dict[str, Any], cause: str) -> int:
    return budget(record, cause) - spent(record, cause)


def in_job_entries(record: dict[str, Any], job_id: str) -> list[dict[str, Any]]:
    """This incarnation's in-job restarts, warm and cold."""
    return [r for r in record.get("restarts", [])
            if r.get("job_id") == job_id and r.get("n") == outcomes.restart_count() and r.get("in_job")]


def in_job_left(record: dict[str, Any], job_id: str) -> bool:
    """The profile's requeue.in_job is per incarnation, warm and cold restarts together."""
    return len(in_job_entries(record, job_id)) < int(_budgets(record).get("in_job", 0))


def marker(paths: RunPaths, job_id: str, restart_count: int) -> RestartRequest | None:
    """The restart request incarnation `restart_count` of the job left before asking Slurm
    (requeue.request), if it is readable; one from another incarnation or job is stale."""
    return RestartRequest.read(paths, job_id, restart_count)


def requested_here(paths: RunPaths, job_id: str) -> str | None:
    """The cause of the requeue this incarnation already asked for (rank 0, after a stop), if any."""
    found = marker(paths, job_id, outcomes.restart_count())
    return None if found is None else found.cause


def restart_cause(paths: RunPaths, job_id: str, restart_count: int) -> tuple[str, str]:
    """The marker the previous incarnation's requester left, else what accounting says that
    incarnation ended as."""
    found = marker(paths, job_id, restart_count - 1)
    if found is not None:
        return found.cause, found.detail

    return cause_of_previous(commands.incarnation_states(job_id))


def cause_of_previous(states: list[str]) -> tuple[str, str]:
    """(cause, detail) of a restart from accounting: how the incarnation before the current one ended."""
    previous = states[-2] if len(states) >= 2 else ""
    detail = f"slurm state {previous}" if previous else "no marker and no accounting record"
    return SLURM_STATE_CAUSE.get(previous, "unknown"), detail


def _recorded(record: dict[str, Any], job_id: str, restart_count: int, attempt: int = 0) -> dict[str, Any] | None:
    """The restart entry that started incarnation `restart_count`'s srun step `attempt` (0: the
    incarnation itself, by a requeue or a resubmit; 1..: an in-job restart)."""
    done = [r for r in record.get("restarts", []) if r.get("job_id") == job_id and r.get("n") == restart_count
            and r.get("in_job", 0) == attempt and r.get("kind") != "warm"]
    return done[0] if done else None


def record_restart(paths: RunPaths, job_id: str, restart_count: int, resumed_step: int | None) -> dict[str, Any]:
    """On start of incarnation N > 0: append the restart and its cause to run.json (once), under its lock."""
    done = _recorded(RunRecord(paths).read(), job_id, restart_count)
    if done:
        return done
    cause, detail = restart_cause(paths, job_id, restart_count)  # before the lock: it may ask sacct
    lost = lost_steps(paths, resumed_step)
    with RunRecord(paths).editing() as record:
        entry = _recorded(record, job_id, restart_count)
        if entry is None:
            entry = RestartEntry(kind="requeue", n=restart_count, job_id=job_id, cause=cause, detail=detail, time=now(),
                                 resumed_step=resumed_step, lost_steps=lost).record()
            record.setdefault("restarts", []).append(entry)
            if spent(record, cause) > budget(record, cause):
                record["final"] = f"{cause} budget of {budget(record, cause)} spent"
    RestartRequest.clear(paths)
    StopMarker.clear(paths)
    return entry


def note_resumed(paths: RunPaths, job_id: str, restart_count: int, attempt: int,
                 resumed_step: int | None) -> dict[str, Any] | None:
    """Rank 0 of a start that the login node or the supervisor recorded before it ran (a resubmitted
    job's restart 0; an in-job restart): its entry learns the step it resumed from and the steps
    that run again. The entry, or None if there is none."""
    entry = _recorded(RunRecord(paths).read(), job_id, restart_count, attempt)
    if entry is None or entry.get("resumed_step") is not None:
        return entry
    lost = lost_steps(paths, resumed_step)
    with RunRecord(paths).editing() as record:
        entry = _recorded(record, job_id, restart_count, attempt)
        if entry is not None:
            entry.update(resumed_step=resumed_step, lost_steps=lost)
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


def mark_preempted(paths: RunPaths, job_id: str, step: int | None, detail: str) -> None:
    """A preemption that Slurm ends for good (PreemptMode=CANCEL): the run's record says so, since
    the job itself, having exited in time, is COMPLETED in Slurm's eyes."""
    RunRecord(paths).update(preempted={"job_id": job_id, "step": step, "detail": detail, "time": now()})
