"""The restart policy: what comes next after the ranks' step failed, a rank raised with every
process alive (warm), or the health gate failed. Every function answers with a Decision.

A crash, a hang or a lost node (with spare nodes, or elastic) is first restarted inside the
allocation (a new srun step, or for an exception the processes survive a warm restart in them),
within the profile's requeue.in_job per incarnation; then it goes through the queue. An error that
repeats at the same step is deterministic and never restarted. Every restart is appended to
run.json with its cause (restarts).
"""

from __future__ import annotations

from dataclasses import asdict

from slurmkit.common import outcomes
from slurmkit.common.errors import SlurmError
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import HangMarker, HealthReport
from slurmkit.common.outcomes import Outcome
from slurmkit.common.record import Failure, RestartEntry, RunFile, RunRecord, UnhealthyNode
from slurmkit.worker.ft import allocation, requeue, restarts
from slurmkit.worker.ft.allocation import Allocation
from slurmkit.worker.ft.decision import Action, Decision


def after_failure(paths: RunPaths, job_id: str, exit_code: int, alloc: Allocation | None) -> Decision:
    """The supervisor, after the ranks' srun step exited `exit_code` (non-zero) without a stop
    (a stop is requeue.after_stop's, whatever the exit code). `alloc`: what the job holds now (None
    where Slurm could not say)."""
    found = this_attempt(paths, job_id, RunFile(paths).read().num_tasks)
    if all(o is not None and o.ok for o in found):
        # Every rank of this incarnation recorded success: it failed while exiting, after its work was done.
        return Decision(Action.COMPLETE, message=f"srun exit {exit_code}, but every rank had finished its work")
    hangs = HangMarker.take_all(paths)
    step = restarts.last_step(paths)
    lost = _newly_lost(paths, job_id, alloc)
    if hangs:
        cause, detail = "hang", hangs[0]
    elif lost:
        cause, detail = "node_failure", f"lost {','.join(lost)} (the job no longer holds it)"
    else:
        signature = error_signature(found)
        cause, detail = "crash", signature or f"srun exit code {exit_code}"
        with RunFile(paths).editing() as record:
            repeated = _repeated(record, signature, step)
        if repeated:
            return Decision(Action.END, cause, step, why="deterministic",
                            message=f"not requeued: the same error at step {step} twice ({signature})")
    in_job = restart_in_job(paths, job_id, cause, step, detail, alloc, lost)
    if in_job is not None:
        return in_job
    return requeue.ask(paths, job_id, cause, step, detail, bad_nodes=lost)


def restart_in_job(paths: RunPaths, job_id: str, cause: str, step: int | None, detail: str,
                   alloc: Allocation | None, lost: list[str] | None = None) -> Decision | None:
    """After a crash, hang or lost node: record an in-job restart if this incarnation has one left
    (the profile's requeue.in_job), the cause's budget allows it and the allocation still has the
    nodes a step needs (a spare in place of a lost one, or elastic: the nodes left); the Decision,
    or None to go through the queue instead. The entry and the Decision name the node count of the
    next step (`nodes`), the held nodes it leaves out (`exclude`) and the nodes lost (`nodes_lost`).

    A new srun step in the same allocation, not an in-process restart: a rank that died or hung
    is gone with its step either way, and the fresh step starts every rank the way a requeue would
    (imports, rendezvous, the newest valid checkpoint), minus the queue.
    """
    attempt = outcomes.attempt()
    if alloc is None or not alloc.fits:
        return None  # an allocation Slurm cannot describe is left to the requeue
    with RunFile(paths).editing() as record:
        if not (record.in_job_left(job_id, outcomes.restart_count()) and record.allowed(cause)):
            return None
        record.restarts.append(RestartEntry(
            kind="in_job", n=outcomes.restart_count(), in_job=attempt + 1, job_id=job_id, cause=cause, detail=detail,
            time=restarts.now(), step=step, exclude=list(alloc.unusable), nodes_lost=lost or [],
            nodes=alloc.step_nodes))
        left = record.left(cause)
    return Decision(Action.RESTART_IN_JOB, cause, step, nodes=alloc.step_nodes, exclude=alloc.unusable,
                    message=f"restarting in the job (attempt {attempt + 1}): {cause} ({detail}); "
                            f"{left} {cause} restart(s) left")


def restart_warm(paths: RunPaths, job_id: str, step: int, signature: str | None, detail: str,
                 resumed_step: int | None, live: bool = False) -> Decision | None:
    """Rank 0, after an exception that every rank's process survived: record a warm in-job restart
    (in the process, from memory, `live` where from the live state; slurmkit.worker.ft.warm) if the
    deterministic-error rule, the in-job limit and the crash budget allow; the Decision, or None.
    On None the ranks re-raise and the supervisor decides (after_failure), so a failure is noted
    only where it restarts here or ends the run."""
    with RunFile(paths).editing() as record:
        if not (record.in_job_left(job_id, outcomes.restart_count()) and record.allowed("crash")):
            return None
        if _repeated(record, signature, step):
            return None
        n_in_job = len(record.in_job_entries(job_id, outcomes.restart_count())) + 1
        record.restarts.append(RestartEntry(
            kind="warm", n=outcomes.restart_count(), in_job=n_in_job, job_id=job_id, cause="crash", detail=detail,
            time=restarts.now(), step=step, resumed_step=resumed_step, lost_steps=step - (resumed_step or 0),
            live=live or None))
        left = record.left("crash")
    return Decision(Action.RESTART_WARM, "crash", step, message=(
        f"restarting in the job, warm (in-job restart {n_in_job}): crash ({detail}) at step {step}; "
        f"{left} crash restart(s) left"))


def after_health_gate(paths: RunPaths, job_id: str) -> Decision:
    """Some node failed the health gate: requeue (cause node_failure) with those nodes excluded."""
    found = HealthReport.take_all(paths)
    nodes = [f.node for f in found]
    detail = "; ".join(f"{f.node}: {', '.join(f.problems)}" for f in found) or "health gate failed"
    with RunFile(paths).editing() as record:
        record.unhealthy.extend(UnhealthyNode(**asdict(f), time=restarts.now()) for f in found)
    return requeue.ask(paths, job_id, "node_failure", restarts.last_step(paths), f"health gate: {detail}",
                       bad_nodes=nodes)


def this_attempt(paths: RunPaths, job_id: str, num_tasks: int) -> list[Outcome | None]:
    """This step's outcome records (never submitit's pickles); older incarnations' and attempts' count as none."""
    count, attempt = outcomes.restart_count(), outcomes.attempt()
    found = [paths.outcome(job_id, rank) for rank in range(num_tasks)]
    return [o if o is not None and (o.restart_count, o.attempt) == (count, attempt) else None for o in found]


def error_signature(found: list[Outcome | None]) -> str | None:
    """The error line of the first rank that raised by itself (not because a peer was lost), if any."""
    return next((o.error_line for o in found if o is not None and not o.ok and not o.peer_failed), None)


def _repeated(record: RunRecord, signature: str | None, step: int | None) -> bool:
    """The same error at the same step seen before: deterministic, so the run ends (record.final);
    else the failure is noted for next time."""
    if signature and any(f.error == signature and f.step == step for f in record.failures):
        record.final = f"deterministic error at step {step}: {signature}"
        return True
    record.failures.append(Failure(error=signature, step=step, time=restarts.now()))
    return False


def _newly_lost(paths: RunPaths, job_id: str, alloc: Allocation | None) -> list[str]:
    """Nodes this incarnation lost since its last in-job restart (none where Slurm cannot say)."""
    if alloc is None:
        return []
    entries = RunFile(paths).read().in_job_entries(job_id, outcomes.restart_count())
    known = {n for r in entries for n in r.nodes_lost or []}
    return [n for n in alloc.lost if n not in known]


def read_allocation(job_id: str, step_nodes: int | None, least: int | None) -> Allocation | None:
    """What the job holds now (allocation.read), or None where Slurm cannot say."""
    try:
        return allocation.read(job_id, step_nodes, least)
    except SlurmError:
        return None
