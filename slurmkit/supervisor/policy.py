"""The restart policy, pure: `decide(state, event) -> Decision`, no I/O. What the run's record says
(State) and what just happened (an Event) go in; a typed Decision comes out, with the effects it
asks for (a failure noted, a restart entry, a verdict, a requeue). The job's supervisor reads the
state, gathers the event and carries the effects out (supervisor.effects); tests call `decide`
with a table of cases.

A crash, a hang or a lost node (with spare nodes, or elastic) is first restarted inside the
allocation (a new srun step, or for an exception the processes survive a warm restart in them),
within the profile's requeue.in_job per incarnation; then it goes through the queue. An error that
repeats at the same step is deterministic and never restarted, and restarts that keep coming
back to the same checkpoint end the run (the crash-loop breaker, requeue.no_progress_restarts). A
stop on a signal is requeued for its cause (preemption, time limit) within that cause's budget, or
left to Slurm (a plain SIGTERM).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, replace

from slurmkit.common.cause import Cause
from slurmkit.common.markers import HangMarker, HealthReport, PruneRequest, Straggler
from slurmkit.common.node_ledger import BlameCause
from slurmkit.common.outcomes import Outcome
from slurmkit.common.record import Failure, Preempted, RestartEntry, RunRecord, UnhealthyNode
from slurmkit.supervisor.allocation import Allocation
from slurmkit.supervisor.decision import Action, Decision

TIMEOUT_MARGIN_S = 60  # Slurm checks limits about every 30 s, so the signal may come that early
IN_JOB_RETRY_S = 30.0  # after a crash or hang the job is not being stopped: a controller hiccup may take this long


@dataclass(frozen=True)
class State:
    """What the decider knows of the run when something happened."""

    record: RunRecord
    job_id: str
    restart_count: int
    """Slurm's incarnation (SLURM_RESTART_COUNT)."""
    attempt: int
    """The srun step of this incarnation that just ended (0, then 1.. after in-job restarts)."""
    last_step: int | None
    """The last step the metrics recorded."""
    now: str
    """The time to stamp records with."""
    alloc: Allocation | None = None
    """What the job holds now (None where Slurm could not say, or nothing to ask)."""
    pruned: PruneRequest | None = None
    """A search's pruner stopped this trial: whatever ended its step, it never starts again."""


@dataclass(frozen=True)
class StepFailed:
    """The ranks' srun step exited `exit_code` (non-zero) without a stop."""

    exit_code: int
    outcomes: tuple[Outcome | None, ...]
    """This step's outcome record of each rank (None: none written)."""
    hangs: tuple[HangMarker, ...] = ()
    """The hang markers of ranks whose watchdog fired (or whose startup timeout did)."""


@dataclass(frozen=True)
class Preempting:
    """Slurm has picked the job for preemption (scontrol's PreemptTime)."""

    at: str
    mode: str
    """Its partition's PreemptMode: REQUEUE, CANCEL, ..."""
    left_s: float
    """Seconds of grace left."""

    @property
    def requeues(self) -> bool:
        """Under CANCEL the preempted job does not come back; under REQUEUE it must ask in time."""
        return "CANCEL" not in self.mode.upper()


@dataclass(frozen=True)
class StepStopped:
    """Rank 0 recorded that the ranks stopped on a signal (common.markers.Stopped), and saved."""

    step: int | None
    requeue_signal: bool
    """The profile's signal (else SIGTERM)."""
    preempting: Preempting | None
    """Slurm's preemption of the job, if it is preempting it."""
    left_s: float | None
    """Seconds left of the time limit (None: unknown)."""


@dataclass(frozen=True)
class HealthFailed:
    """Some nodes failed the health gate."""

    reports: tuple[HealthReport, ...]


@dataclass(frozen=True)
class RankRaised:
    """Rank 0, after an exception that every rank's process survived (worker.train.warm)."""

    step: int
    signature: str | None
    detail: str
    resumed_step: int | None
    """The step a warm restart would resume from (None: the initial state)."""
    live: bool
    """It would restore from the live state (no step lost), not the host copy."""


@dataclass(frozen=True)
class StragglerLasted:
    """Rank 0 has named `straggler` for the profile's straggler_patience_s (straggler_action: replace)."""

    straggler: Straggler
    lasted_s: float


Event = StepFailed | StepStopped | HealthFailed | RankRaised | StragglerLasted


def decide(state: State, event: Event) -> Decision:
    """What comes next. Every restart, in the job or through the queue, is decided here."""
    if state.pruned is not None and not isinstance(event, StragglerLasted):
        return _pruned(state, event, state.pruned)
    if isinstance(event, StepFailed):
        return _step_failed(state, event)
    if isinstance(event, StepStopped):
        return _step_stopped(state, event)
    if isinstance(event, HealthFailed):
        return _health_failed(state, event)
    if isinstance(event, StragglerLasted):
        return _straggler_lasted(state, event)
    return _rank_raised(state, event)


def error_signature(found: tuple[Outcome | None, ...]) -> str | None:
    """The error line of the first rank that raised by itself (not because a peer was lost), if any."""
    return next((o.error_line for o in found if o is not None and not o.ok and not o.peer_failed), None)


def cause_of_signal(left_s: float | None, signal_delay_s: int) -> tuple[Cause, str]:
    """(cause, detail) of the profile's signal, from the seconds the job had left (squeue %L)."""
    if left_s is not None and left_s <= signal_delay_s + TIMEOUT_MARGIN_S:
        return Cause.TIMEOUT, f"{left_s:.0f} s left of the time limit"
    return Cause.PREEMPTION, "signal with time to spare" if left_s is None else f"signal with {left_s:.0f} s left"


def newly_lost(state: State) -> list[str]:
    """Nodes this incarnation lost since its last in-job restart (none where Slurm cannot say)."""
    if state.alloc is None:
        return []
    entries = state.record.in_job_entries(state.job_id, state.restart_count)
    known = {n for r in entries for n in r.nodes_lost or []}
    return [n for n in state.alloc.lost if n not in known]


FAILURES = (Cause.CRASH, Cause.HANG, Cause.STARTUP_HANG, Cause.NODE_FAILURE)


def no_progress(record: RunRecord) -> tuple[int, list[RestartEntry]] | None:
    """(the step, the restarts) where the crash-loop breaker holds: the last
    requeue.no_progress_restarts restarts were each after a failure and each came back to the same
    checkpointed step (known: a restart whose resumed step nobody recorded proves nothing). The
    decider cannot see commits: a last incarnation that saved a newer step before it failed is
    judged by the restarts before it all the same."""
    n = record.profile.requeue.no_progress_restarts
    last = record.restarts[-n:] if n else []
    steps = {r.resumed_step for r in last}
    if len(last) < n or n == 0 or len(steps) != 1 or None in steps or any(r.cause not in FAILURES for r in last):
        return None
    step = steps.pop()
    assert step is not None
    return step, last


def _stuck(s: State, cause: Cause, step: int | None, detail: str) -> Decision | None:
    """END with why `no_progress` where the breaker holds, naming the cause that keeps repeating."""
    found = no_progress(s.record)
    if found is None:
        return None
    at, last = found
    counts = Counter(r.cause for r in last)
    repeated = ", ".join(f"{c} x{k}" for c, k in counts.most_common())
    said = f"no progress: the last {len(last)} restarts ({repeated}) each came back to step {at}"
    return Decision(Action.END, cause, step, why="no_progress", said=said, final=said,
                    message=f"{said}; now {cause} ({detail}): not restarted")


def _step_failed(s: State, e: StepFailed) -> Decision:
    if e.outcomes and all(o is not None and o.ok for o in e.outcomes):
        # Every rank of this step recorded success: it failed while exiting, after its work was done.
        return Decision(Action.COMPLETE, message=f"srun exit {e.exit_code}, but every rank had finished its work")
    step, lost, failure = s.last_step, newly_lost(s), None
    crashed: list[tuple[str, BlameCause]] = []
    if e.hangs:
        startup = any(h.startup for h in e.hangs)
        cause, detail = (Cause.STARTUP_HANG if startup else Cause.HANG), e.hangs[0].describe()
    elif lost:
        cause, detail = Cause.NODE_FAILURE, f"lost {','.join(lost)} (the job no longer holds it)"
    else:
        signature = error_signature(e.outcomes)
        cause, detail = Cause.CRASH, signature or f"srun exit code {e.exit_code}"
        if signature and any(f.error == signature and f.step == step for f in s.record.failures):
            return Decision(Action.END, cause, step, why="deterministic",
                            final=f"deterministic error at step {step}: {signature}",
                            message=f"not requeued: the same error at step {step} twice ({signature})")
        node = _crash_node(s, e.outcomes)
        failure = Failure(error=signature, step=step, time=s.now, node=node)
        if node is not None and any(f.node == node for f in s.record.failures):
            crashed = [(node, "crash")]
    decision = _stuck(s, cause, step, detail) or _in_job(s, cause, step, detail, lost) \
        or _requeue(s, cause, step, detail, bad_nodes=lost)
    hung: list[tuple[str, BlameCause]] = [(n, "hang") for n in _nodes_of(s, [h.rank for h in e.hangs])]
    return replace(decision, failure=failure, blame=(*((n, "lost") for n in lost), *hung, *crashed))


def _nodes_of(s: State, ranks: list[int]) -> list[str]:
    """The nodes `ranks` ran on, where the step's node order is known: the incarnation's first step
    (attempt 0) runs rank r on the job's node r // tasks_per_node, as srun places them."""
    per_node = s.record.resources.tasks_per_node
    if s.alloc is None or s.attempt != 0 or not per_node:
        return []
    return sorted({s.alloc.started[r // per_node] for r in ranks if 0 <= r < per_node * len(s.alloc.started)})


def _crash_node(s: State, found: tuple[Outcome | None, ...]) -> str | None:
    """The one node whose ranks raised by themselves while the job's other nodes' did not: a node's
    fault more likely than the code's (which raises on every node). None where it is not one node,
    or the job has one node."""
    raised = [r for r, o in enumerate(found) if o is not None and not o.ok and not o.peer_failed]
    nodes = _nodes_of(s, raised)
    return nodes[0] if len(nodes) == 1 and s.alloc is not None and len(s.alloc.started) > 1 else None


def _in_job(s: State, cause: Cause, step: int | None, detail: str, lost: list[str]) -> Decision | None:
    """A new srun step in this allocation, if this incarnation has an in-job restart left (the
    profile's requeue.in_job), the cause's budget allows it and the allocation still has the nodes
    a step needs (a spare in place of a lost one, or elastic: the nodes left); else None.

    A new step, not an in-process restart: a rank that died or hung is gone with its step either
    way, and the fresh step starts every rank the way a requeue would (imports, rendezvous, the
    newest valid checkpoint), minus the queue."""
    r, alloc = s.record, s.alloc
    if alloc is None or not alloc.fits:
        return None  # an allocation Slurm cannot describe is left to the requeue
    if not (r.in_job_left(s.job_id, s.restart_count) and r.allowed(cause)):
        return None
    entry = RestartEntry(kind="in_job", n=s.restart_count, in_job=s.attempt + 1, job_id=s.job_id, cause=cause,
                         detail=detail, time=s.now, step=step, exclude=list(alloc.unusable), nodes_lost=lost,
                         nodes=alloc.step_nodes)
    return Decision(Action.RESTART_IN_JOB, cause, step, nodes=alloc.step_nodes, exclude=alloc.unusable,
                    entry=entry, message=f"restarting in the job (attempt {s.attempt + 1}): {cause} ({detail}); "
                                         f"{r.left(cause) - 1} {cause} restart(s) left")


def _requeue(s: State, cause: Cause, step: int | None, detail: str, bad_nodes: list[str] | None = None,
             within_s: float | None = None, said: str = "") -> Decision:
    """Through the queue for `cause`, if its budget allows; `detail` goes into the requeue marker
    (the next restart's detail), `said` (default: detail) begins the message."""
    said = said or detail
    if not s.record.allowed(cause):
        return Decision(Action.END, cause, step, why="budget", said=said,
                        final=f"{cause} budget of {s.record.budget(cause)} spent",
                        message=f"{said}; {cause} budget spent, not requeued")
    return Decision(Action.REQUEUE, cause, step, exclude=tuple(bad_nodes or ()), detail=detail,
                    within_s=IN_JOB_RETRY_S if within_s is None else within_s, said=said,
                    message=f"{said}; requeued ({cause}): the run starts again")


def _step_stopped(s: State, e: StepStopped) -> Decision:
    """The ranks stopped (and saved, at `step`): what the signal meant.

    - Slurm is preempting the job (its PreemptTime is set). That is SIGTERM alone, or the profile's
      signal first where the cluster sends the user signal on preemption. Under PreemptMode=REQUEUE
      the requeue is asked for now, inside GraceTime: a job that ends before its grace is over is
      recorded COMPLETED by Slurm and never comes back. Under CANCEL the run is marked preempted;
      `slurmkit resubmit` resumes it.
    - Else the profile's signal is the time limit coming, or a preemption by hand
      (`scancel --signal`): requeued for its cause, within budget.
    - Else SIGTERM is scancel, `scontrol requeue` or the limit itself: Slurm decides, nothing is asked.
    """
    at = f"stopped at step {e.step}" if e.step is not None else "stopped"
    pre = e.preempting
    if pre is not None:
        detail = f"preempted by a higher-priority job at {pre.at} (PreemptMode={pre.mode})"
        if not pre.requeues:
            return Decision(Action.END, Cause.PREEMPTION, e.step, why="cancel_mode",
                            preempted=Preempted(job_id=s.job_id, step=e.step, detail=detail, time=s.now),
                            message=f"{detail}; {at}. It does not come back by itself: resume it with "
                                    f"`slurmkit resubmit {s.record.run_id}`")
        return _requeue(s, Cause.PREEMPTION, e.step, detail, within_s=pre.left_s, said=f"{detail}; {at}")
    if not e.requeue_signal:
        return Decision(Action.END, None, e.step, why="slurm_decides",
                        message=f"SIGTERM: {at}; Slurm ends or requeues the job itself")
    cause, detail = cause_of_signal(e.left_s, s.record.profile.signal_delay_s)
    # Time left unknown (squeue did not answer): the controller may be back within a usual retry span.
    return _requeue(s, cause, e.step, detail, within_s=e.left_s, said=f"{at} ({cause}: {detail})")


def _pruned(s: State, e: Event, p: PruneRequest) -> Decision:
    """A pruned trial ends at its stop (the driver's signal) or whatever else ended its step: no
    restart in the job, warm or through the queue, whatever budget is left."""
    step = e.step if isinstance(e, StepStopped | RankRaised) and e.step is not None else s.last_step
    if isinstance(e, RankRaised):
        return Decision(Action.ESCALATE, None, step, message="no warm restart: the search pruned this trial")
    said = f"pruned by the search (value {p.value:g} at step {p.step})"
    return Decision(Action.END, None, step, why="pruned", said=said, final=said,
                    message=f"{said}; stopped at step {step}, not restarted")


def _health_failed(s: State, e: HealthFailed) -> Decision:
    """Some node failed the health gate: requeue (cause node_failure) with those nodes excluded."""
    detail = "; ".join(f"{f.node}: {', '.join(f.problems)}" for f in e.reports) or "health gate failed"
    unhealthy = tuple(UnhealthyNode(**asdict(f), time=s.now) for f in e.reports)
    decision = _requeue(s, Cause.NODE_FAILURE, s.last_step, f"health gate: {detail}",
                        bad_nodes=[f.node for f in e.reports])
    return replace(decision, unhealthy=unhealthy, blame=tuple((f.node, "health_gate") for f in e.reports))


def _rank_raised(s: State, e: RankRaised) -> Decision:
    """A warm restart in the ranks' processes (from memory; from the live state where `live`) if
    the in-job limit, the crash budget and the deterministic-error rule allow; else ESCALATE: the
    ranks re-raise, their step fails, and the supervisor decides (a failure is noted only where
    it restarts here, so never twice)."""
    r = s.record
    repeated = e.signature is not None and any(f.error == e.signature and f.step == e.step for f in r.failures)
    if repeated or no_progress(r) is not None or not (r.in_job_left(s.job_id, s.restart_count)
                                                     and r.allowed(Cause.CRASH)):
        return Decision(Action.ESCALATE, Cause.CRASH, e.step,
                        message=f"no warm restart: crash ({e.detail}) at step {e.step}; the supervisor decides")
    n_in_job = len(r.in_job_entries(s.job_id, s.restart_count)) + 1
    entry = RestartEntry(kind="warm", n=s.restart_count, in_job=n_in_job, job_id=s.job_id, cause=Cause.CRASH,
                         detail=e.detail, time=s.now, step=e.step, resumed_step=e.resumed_step,
                         lost_steps=e.step - (e.resumed_step or 0), live=e.live or None)
    return Decision(Action.RESTART_WARM, Cause.CRASH, e.step, entry=entry,
                    failure=Failure(error=e.signature, step=e.step, time=s.now), message=(
                        f"restarting in the job, warm (in-job restart {n_in_job}): crash ({e.detail}) at step "
                        f"{e.step}; {r.left(Cause.CRASH) - 1} crash restart(s) left"))


def _straggler_lasted(s: State, e: StragglerLasted) -> Decision:
    """A straggler is replaced the way a lost node is: in the job, where it holds another node that
    can take the straggler's place (spare nodes) or can go on without it (elastic), and has an in-job
    restart and node_failure budget left: the ranks stop at an agreed step and save, and the next
    step leaves the node out (REPLACE_IN_JOB). Otherwise the ranks go on, and the node is kept off
    at the run's next requeue, whatever its cause (CONTINUE)."""
    g = e.straggler
    detail = f"straggler: rank {g.rank} on {g.node} scored {g.score:.2f} for {e.lasted_s:.0f} s"
    r, alloc = s.record, s.alloc
    without = alloc.without(g.node) if alloc is not None else None
    if (without is not None and without.fits and r.in_job_left(s.job_id, s.restart_count)
            and r.allowed(Cause.NODE_FAILURE)):
        entry = RestartEntry(kind="in_job", n=s.restart_count, in_job=s.attempt + 1, job_id=s.job_id,
                             cause=Cause.NODE_FAILURE, detail=detail, time=s.now, step=s.last_step,
                             exclude=list(without.unusable), nodes=without.step_nodes)
        return Decision(Action.REPLACE_IN_JOB, Cause.NODE_FAILURE, s.last_step, nodes=without.step_nodes,
                        exclude=without.unusable, entry=entry,
                        message=f"{detail}: the ranks stop at an agreed step and go on without {g.node} "
                                f"(attempt {s.attempt + 1})")
    return Decision(Action.CONTINUE, Cause.NODE_FAILURE, s.last_step, avoid_next=(g.node,),
                    message=f"{detail}: no node to replace it in the job, so the ranks go on; the run's next "
                            f"requeue leaves {g.node} out")
