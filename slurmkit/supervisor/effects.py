"""The decider's eyes and hands, around the pure policy (supervisor.policy.decide): read the state
and gather the event (the run's record, the ranks' outcomes, markers, Slurm's answers), then carry
out the Decision's effects (run.json under its lock, the requeue marker, scontrol). The job's
supervisor calls `decide` here after every step; rank 0 only for a warm restart in its processes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import replace

from slurmkit.common import outcomes
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import HangMarker, HealthReport, PruneRequest, RestartRequest, Stopped
from slurmkit.common.node_ledger import blame_here
from slurmkit.common.outcomes import Outcome
from slurmkit.common.record import RunFile, RunRecord
from slurmkit.common.slurm_env import expand_hostlist
from slurmkit.errors import SlurmError
from slurmkit.slurm import commands
from slurmkit.supervisor import policy
from slurmkit.supervisor.allocation import Allocation
from slurmkit.supervisor.decision import Action, Decision
from slurmkit.supervisor.policy import Event, Preempting, State
from slurmkit.supervisor.restarts import last_step, now


def state(paths: RunPaths, job_id: str, alloc: Allocation | None = None) -> State:
    """The run as the decider sees it now (this incarnation, this in-job attempt)."""
    return State(RunFile(paths).read(), job_id, outcomes.restart_count(), outcomes.attempt(), last_step(paths),
                 now(), alloc, PruneRequest.read(paths))


def decide(paths: RunPaths, job_id: str, event: Event, alloc: Allocation | None = None,
           before: Callable[[Decision], None] | None = None) -> Decision:
    """policy.decide on the state read now, its effects carried out: the one way a restart is decided.
    `before`: called with the decision before its effects (a heterogeneous job stops its other parts,
    which save, before a requeue)."""
    decision = policy.decide(state(paths, job_id, alloc), event)
    if before is not None:
        before(decision)
    return carry_out(paths, job_id, decision)


# -- the events --------------------------------------------------------------------------------
def this_attempt(paths: RunPaths, job_id: str, num_tasks: int) -> tuple[Outcome | None, ...]:
    """This step's outcome records (never submitit's pickles); older incarnations' and attempts' count as none."""
    count, attempt = outcomes.restart_count(), outcomes.attempt()
    found = [paths.outcome(job_id, rank) for rank in range(num_tasks)]
    return tuple(o if o is not None and (o.restart_count, o.attempt) == (count, attempt) else None for o in found)


def step_failed(paths: RunPaths, job_id: str, exit_code: int) -> policy.StepFailed:
    """The ranks' step failed: their outcome records and the hang markers (taken: read and removed)."""
    found = this_attempt(paths, job_id, RunFile(paths).read().num_tasks)
    return policy.StepFailed(exit_code, found, tuple(HangMarker.take_all(paths)))


def step_stopped(job_id: str, stopped: Stopped) -> policy.StepStopped:
    """The ranks stopped: whether Slurm is preempting the job, and how much time it has left. A
    controller that does not answer in time reads as no preemption, and time left unknown."""
    try:
        pre = commands.preemption(job_id)
    except SlurmError:
        pre = None
    if pre is not None:
        return policy.StepStopped(stopped.step, stopped.requeue_signal, Preempting(pre.at, pre.mode, pre.left_s), None)
    left_s = None
    if stopped.requeue_signal:
        try:
            left_s = commands.time_left_s(job_id)
        except SlurmError:
            left_s = None
    return policy.StepStopped(stopped.step, stopped.requeue_signal, None, left_s)


def health_failed(paths: RunPaths) -> policy.HealthFailed:
    """The health gate's reports of the nodes that failed it (taken)."""
    return policy.HealthFailed(tuple(HealthReport.take_all(paths)))


def read_allocation(job_id: str, step_nodes: int | None, least: int | None,
                    avoid: tuple[str, ...] = (), group: int | None = None) -> Allocation | None:
    """What the job holds now, or None where Slurm cannot say. `step_nodes`: the nodes the last
    step of the ranks ran on, for a job that shrinks (spare nodes, elastic); None for one that never
    does (a lost node ends it), where only its nodes' states are asked. `least`: the fewest a step
    may run on. `avoid`: held nodes this job has left out already (a straggler's, replaced).
    `group`: a heterogeneous job's part, whose nodes are its het group's."""
    nodelist = "SLURM_JOB_NODELIST" if group is None else f"SLURM_JOB_NODELIST_HET_GROUP_{group}"
    started = tuple(expand_hostlist(os.environ.get(nodelist, "")))
    try:
        held = tuple(commands.job_nodes(job_id)) if step_nodes is not None else started
        unusable = tuple(commands.unusable_nodes(",".join(held))) if held else ()
    except SlurmError:
        return None
    unusable += tuple(n for n in avoid if n in held and n not in unusable)
    return Allocation(started, held, unusable, step_nodes or len(started), least)


# -- the effects -------------------------------------------------------------------------------
def carry_out(paths: RunPaths, job_id: str, decision: Decision) -> Decision:
    """The Decision's effects: run.json first (under its lock), then a requeue. A requeue that
    Slurm refuses, or whose controller does not answer in time, comes back as the Decision it
    became (END slurm_failed, REQUEUE uncertain), never a traceback."""
    d = decision
    write_down(paths, d)
    if d.action is not Action.REQUEUE:
        return d
    try:
        requeue(paths, job_id, d)
    except commands.RequeueUncertain as exc:
        return replace(d, why="uncertain",
                       message=f"{d.said}; the requeue may or may not have gone through: {exc.one_line()}")
    except SlurmError as exc:
        return replace(d, action=Action.END, why="slurm_failed",
                       message=f"{d.said}; the requeue failed, so the job ends here: {exc.one_line()}")
    return d


def write_down(paths: RunPaths, d: Decision) -> None:
    """The Decision's part of run.json (one locked write, where it has one), and its blame in the
    user's node ledger."""
    if d.blame:
        blame_here(d.blame, paths.run_id)
    if d.failure or d.entry or d.final or d.unhealthy or d.preempted or d.avoid_next:
        with RunFile(paths).editing() as record:
            if d.failure:
                record.failures.append(d.failure)
            if d.entry:
                record.restarts.append(d.entry)
            if d.final:
                record.final = d.final
            record.unhealthy.extend(d.unhealthy)
            if d.preempted:
                record.preempted = d.preempted
            record.excluded_nodes = sorted({*record.excluded_nodes, *d.avoid_next})


def requeue(paths: RunPaths, job_id: str, d: Decision) -> None:
    """Ask Slurm to requeue this job for the Decision's cause; the marker goes first, so the next
    incarnation knows its cause for sure. A controller hiccup is retried for `within_s`, the time
    the job has left (a grace, a limit).

    The Decision's `exclude` (a failed health gate, a lost node) join the run's excluded nodes;
    every requeue asks Slurm to keep the job off all of them, as long as the partition still has
    enough other nodes."""
    assert d.cause is not None
    record = RunFile(paths).read()
    excluded = sorted({*record.excluded_nodes, *d.exclude})
    RestartRequest(d.cause, d.step, d.detail, job_id, outcomes.restart_count(), now()).write(paths)
    # Requeueing from inside the job makes Slurm signal this very process; finish both calls first.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        commands.requeue(job_id, within_s=max(1.0, d.within_s - 2))
        note = _exclude(job_id, excluded, record)
    except commands.RequeueUncertain:
        raise  # it may yet go through: the next start must find the cause (a stale marker is never read)
    except BaseException:
        RestartRequest.clear(paths)  # no requeue happened: no marker may say that one was asked for
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if excluded:
        RunFile(paths).update(excluded_nodes=excluded, exclusion=note)


def _exclude(job_id: str, nodes: list[str], record: RunRecord) -> str:
    """Keep the requeued job off `nodes`, if the partition has enough others; says what was done.

    Safe without a race: the requeued job stays COMPLETING (so cannot start) until this process,
    part of its batch step, has exited."""
    if not nodes:
        return ""
    profile_exclude = expand_hostlist(record.profile.exclude or "")
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
