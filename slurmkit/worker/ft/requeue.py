"""What a stop on a signal means, and asking Slurm to requeue the job: the job's supervisor's, the
one decider (worker.supervisor), once the ranks' step ended with their stop record.

The marker (restart-request.json) goes first, so the next incarnation knows its cause for sure;
the budget of that cause is checked and spent under run.json's lock.
"""

from __future__ import annotations

import os
import signal

from slurmkit.common import outcomes
from slurmkit.common.errors import SlurmError
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import RestartRequest
from slurmkit.common.record import RunFile, RunRecord
from slurmkit.common.slurm_env import expand_hostlist
from slurmkit.slurm import commands
from slurmkit.worker.ft import restarts
from slurmkit.worker.ft.decision import Action, Decision

TIMEOUT_MARGIN_S = 60  # Slurm checks limits about every 30 s, so the signal may come that early
IN_JOB_RETRY_S = 30.0  # after a crash or hang the job is not being stopped: a controller hiccup may take this long


def cause_of_signal(left_s: float | None, signal_delay_s: int) -> tuple[str, str]:
    """(cause, detail) of the profile's signal, from the seconds the job had left (squeue %L)."""
    if left_s is not None and left_s <= signal_delay_s + TIMEOUT_MARGIN_S:
        return "timeout", f"{left_s:.0f} s left of the time limit"
    return "preemption", "signal with time to spare" if left_s is None else f"signal with {left_s:.0f} s left"


def after_stop(paths: RunPaths, job_id: str, step: int | None, requeue_signal: bool) -> Decision:
    """The supervisor, once the ranks have stopped (and saved, at `step`): what the stop signal
    meant and what was done about it.

    - Slurm is preempting the job (its PreemptTime is set). That is SIGTERM alone, or the profile's
      signal first where the cluster sends the user signal on preemption. Under PreemptMode=REQUEUE
      the requeue is asked for now, inside GraceTime: a job that ends before its grace is over is
      recorded COMPLETED by Slurm and never comes back. Under CANCEL the run is marked preempted;
      `slurmkit resubmit` resumes it.
    - Else the profile's signal is the time limit coming, or a preemption by hand
      (`scancel --signal`): requeued for its cause, within budget.
    - Else SIGTERM is scancel, `scontrol requeue` or the limit itself: Slurm decides, nothing is asked.

    A requeue that Slurm refuses, or that its controller does not answer in time, is a Decision
    too (the ranks have saved), never a traceback.
    """
    at = f"stopped at step {step}" if step is not None else "stopped"
    try:
        pre = commands.preemption(job_id)
    except SlurmError:
        pre = None
    if pre is not None:
        detail = f"preempted by a higher-priority job at {pre.at} (PreemptMode={pre.mode})"
        if not pre.requeues:
            restarts.mark_preempted(paths, job_id, step, detail)
            return Decision(Action.END, "preemption", step, why="cancel_mode", message=(
                f"{detail}; {at}. It does not come back by itself: resume it with `slurmkit resubmit {paths.run_id}`"))
        return ask(paths, job_id, "preemption", step, detail, within_s=pre.left_s, said=f"{detail}; {at}")
    if not requeue_signal:
        return Decision(Action.END, None, step, why="slurm_decides",
                        message=f"SIGTERM: {at}; Slurm ends or requeues the job itself")
    try:
        left_s = commands.time_left_s(job_id)
    except SlurmError:  # a controller that does not answer in time: the signal reads as a preemption
        left_s = None
    delay = int(RunFile(paths).read().profile.get("signal_delay_s", 0))
    cause, detail = cause_of_signal(left_s, delay)
    # Time left unknown (squeue did not answer): the controller may be back within a usual retry span.
    return ask(paths, job_id, cause, step, detail, within_s=IN_JOB_RETRY_S if left_s is None else left_s,
               said=f"{at} ({cause}: {detail})")


def ask(paths: RunPaths, job_id: str, cause: str, step: int | None, detail: str,
        bad_nodes: list[str] | None = None, within_s: float = IN_JOB_RETRY_S, said: str = "") -> Decision:
    """request(), as a Decision: REQUEUE, or END where the budget is spent or Slurm refused; a
    requeue that may or may not have gone through is REQUEUE, why `uncertain`. `detail` goes into
    the marker (the next restart's detail); `said` (default: detail) begins the message."""
    said = said or detail
    try:
        ok = request(paths, job_id, cause, step, detail, bad_nodes, within_s)
    except commands.RequeueUncertain as exc:
        return Decision(Action.REQUEUE, cause, step, why="uncertain",
                        message=f"{said}; saved; the requeue may or may not have gone through: {exc.one_line()}")
    except SlurmError as exc:
        return Decision(Action.END, cause, step, why="slurm_failed",
                        message=f"{said}; saved; the requeue failed, so the job ends here: {exc.one_line()}")
    if not ok:
        return Decision(Action.END, cause, step, why="budget", message=f"{said}; {cause} budget spent, not requeued")
    return Decision(Action.REQUEUE, cause, step, exclude=tuple(bad_nodes or ()),
                    message=f"{said}; requeued ({cause}): the run starts again")


def request(paths: RunPaths, job_id: str, cause: str, step: int | None = None, detail: str = "",
            bad_nodes: list[str] | None = None, within_s: float = IN_JOB_RETRY_S) -> bool:
    """Ask Slurm to requeue this job for `cause`, if its budget allows; the marker goes first. A
    controller hiccup is retried for `within_s`, the time the job has left (a grace, a limit).

    bad_nodes (a failed health gate, a lost node) join the run's excluded nodes; every requeue asks
    Slurm to keep the job off all of them, as long as the partition still has enough other nodes.
    """
    with RunFile(paths).editing() as record:
        ok = record.allowed(cause)
        if not ok:
            record.final = f"{cause} budget of {record.budget(cause)} spent"
    if not ok:
        return False
    excluded = sorted({*record.excluded_nodes, *(bad_nodes or [])})
    RestartRequest(cause, step, detail, job_id, outcomes.restart_count(), restarts.now()).write(paths)
    # Requeueing from inside the job makes Slurm signal this very process; finish both calls first.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        commands.requeue(job_id, within_s=max(1.0, within_s - 2))
        note = _exclude(job_id, excluded, record)
    except commands.RequeueUncertain:
        raise  # it may yet go through: the next start must find the cause (a stale marker is never read)
    except BaseException:
        # No requeue happened: no marker may say that one was asked for.
        RestartRequest.clear(paths)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if excluded:
        RunFile(paths).update(excluded_nodes=excluded, exclusion=note)
    return True


def _exclude(job_id: str, nodes: list[str], record: RunRecord) -> str:
    """Keep the requeued job off `nodes`, if the partition has enough others; says what was done.

    Safe without a race: the requeued job stays COMPLETING (so cannot start) until this process,
    part of its batch step, has exited.
    """
    if not nodes:
        return ""
    profile_exclude = expand_hostlist(record.profile.get("exclude") or "")
    partition = os.environ.get("SLURM_JOB_PARTITION", "")
    needed = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    try:
        total = int(commands.show_partitions().get(partition, {}).get("TotalNodes", "0") or 0)
        spare = total - len({*nodes, *profile_exclude})
        if spare < needed:
            return (f"not excluded {','.join(nodes)}: partition {partition} would have {spare} node(s) left for a "
                    f"{needed}-node job")
        commands.exclude_nodes(job_id, [*nodes, *profile_exclude])
    except SlurmError as exc:
        return f"not excluded {','.join(nodes)}: {exc.one_line()}"
    return f"excluded {','.join(nodes)}"
