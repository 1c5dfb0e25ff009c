"""The local profile rehearses what a cluster does with a stop (docs/fault-tolerance.md).

On a laptop there is no Slurm to requeue the job and no supervisor around the ranks: the local
executor's controller (submitit's) starts the ranks again when one of them exits with
LOCAL_REQUEUE_STATUS. So once the ranks of a local run have stopped on the profile's signal and
saved, rank 0 asks the same pure policy the supervisor asks (supervisor.policy.decide), writes the
restart entry a requeue on Slurm would get (kind requeue, its cause, the next incarnation's
number), and exits with that status: the ranks start again as a new local incarnation and resume
from the step saved. Budgets apply as on Slurm; submitit's controller starts a job at most
LOCAL_MAX_STARTS times.
"""

from __future__ import annotations

from dataclasses import replace

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RestartEntry
from slurmkit.supervisor import effects, policy
from slurmkit.supervisor.decision import Action

LOCAL_REQUEUE_STATUS = 144
"""submitit.local.local.LOCAL_REQUEUE_RETURN_CODE: its controller starts the job's ranks again."""
LOCAL_MAX_STARTS = 6
"""submitit's controller starts a local job's ranks at most this many times (its max_retry)."""
DECIDES_ENV = "SLURMKIT_LOCAL_DECIDES"
"""0 for the ranks of a local heterogeneous run's other parts (supervisor.local_parts): its primary
part's rank 0 alone decides a stop, once for the run, as the supervisor does on Slurm."""


def local_stop(paths: RunPaths, job_id: str, step: int | None, requeue_signal: bool) -> tuple[str, int]:
    """Rank 0 of a local run, its ranks stopped and saved: the policy's decision, written down;
    (the line for people, the rank's exit status)."""
    state = effects.state(paths, job_id)
    decision = policy.decide(state, policy.StepStopped(step, requeue_signal, None, None))
    starts = 1 + sum(1 for r in state.record.restarts if r.job_id == job_id and r.kind == "requeue")
    if decision.action is Action.REQUEUE and starts >= LOCAL_MAX_STARTS:
        decision = replace(decision, action=Action.END, why="budget",
                           message=f"{decision.said}; not started again: a local job starts at most "
                                   f"{LOCAL_MAX_STARTS} times")
    if decision.action is not Action.REQUEUE:
        effects.write_down(paths, decision)
        return decision.message, 0
    assert decision.cause is not None
    entry = RestartEntry(kind="requeue", n=starts, job_id=job_id, cause=decision.cause, detail=decision.detail,
                         time=state.now, step=decision.step)
    effects.write_down(paths, replace(decision, entry=entry))
    return f"{decision.said}; starting again on this machine (local incarnation {starts})", LOCAL_REQUEUE_STATUS
