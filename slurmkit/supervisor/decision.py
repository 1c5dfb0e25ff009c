"""The typed answer of the restart policy (supervisor.policy.decide): an action, what it needs, and
the effects the decider asks of whoever carries it out (supervisor.effects); the message is for people only."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from slurmkit.common.cause import Cause
from slurmkit.common.node_ledger import BlameCause
from slurmkit.common.record import Failure, Preempted, RestartEntry, UnhealthyNode

Why = Literal["budget", "deterministic", "slurm_failed", "uncertain", "cancel_mode", "slurm_decides", "unreadable",
              "pruned", "no_progress"]
"""Why a run ended or was left as it is (END, REQUEUE): budget: the cause's budget is spent;
deterministic: the same error at the same step twice; slurm_failed: Slurm refused the requeue;
uncertain: the requeue may or may not have gone through; cancel_mode: preempted under
PreemptMode=CANCEL (resume by `slurmkit resubmit`); slurm_decides: SIGTERM, Slurm ends or requeues
the job itself; unreadable: the run's record could not be read (the supervisor ends the job rather
than guess); pruned: a search's pruner stopped the trial (common.markers.PruneRequest); no_progress:
the last requeue.no_progress_restarts restarts, each after a failure, came back to the same
checkpointed step (the crash-loop breaker)."""


class Action(enum.StrEnum):
    COMPLETE = "complete"
    """Every rank had finished its work (the step failed while exiting): the run is done."""
    RESTART_IN_JOB = "restart_in_job"
    """A new srun step of the ranks in this allocation (cold: fresh or standby processes)."""
    RESTART_WARM = "restart_warm"
    """The ranks restart inside their own processes, from memory (slurmkit.worker.train.warm)."""
    ESCALATE = "escalate"
    """No warm restart: the ranks re-raise, their step fails, and the supervisor decides."""
    REPLACE_IN_JOB = "replace_in_job"
    """The ranks stop at an agreed step (they save), then a new step of the ranks in this allocation
    leaves out the Decision's `exclude` (a straggler's node)."""
    CONTINUE = "continue"
    """The ranks go on; the Decision's effects only (`avoid_next`)."""
    REQUEUE = "requeue"
    """The job goes back through Slurm's queue (asked for by the job's supervisor)."""
    END = "end"
    """The run ends here; `why` says why."""


@dataclass(frozen=True)
class Decision:
    action: Action
    cause: Cause | None = None
    """Why the restart (None: complete, or a stop Slurm decides)."""
    step: int | None = None
    """The step the failure or stop happened at, where known."""
    nodes: int | None = None
    """RESTART_IN_JOB, REPLACE_IN_JOB: the node count of the next step (None: as many as before)."""
    exclude: tuple[str, ...] = ()
    """RESTART_IN_JOB, REPLACE_IN_JOB: held nodes the next step leaves out; REQUEUE: nodes the requeued
    job avoids."""
    why: Why | None = None
    message: str = ""
    """One line for the job's log; never parsed."""
    # The effects, carried out in this order by supervisor.effects.carry_out:
    failure: Failure | None = None
    """An error to note in run.json's `failures` (a deterministic one ends the run when seen twice)."""
    entry: RestartEntry | None = None
    """RESTART_IN_JOB, RESTART_WARM, REPLACE_IN_JOB: the restart entry to append to run.json."""
    final: str | None = None
    """END: the verdict to record (run.json's `final`): the run must not be restarted again."""
    unhealthy: tuple[UnhealthyNode, ...] = ()
    """Nodes that failed the health gate, to record."""
    preempted: Preempted | None = None
    """END (cancel_mode): the preemption Slurm ended for good, to record."""
    avoid_next: tuple[str, ...] = ()
    """Nodes the run's next requeue leaves out, whatever its cause (run.json's excluded_nodes)."""
    blame: tuple[tuple[str, BlameCause], ...] = ()
    """(node, cause) for the user's node ledger (common.node_ledger): a failed health gate, a lost
    node, the node of a hung rank."""
    detail: str = ""
    """REQUEUE: the requeue marker's detail (the next restart's)."""
    within_s: float = 30.0
    """REQUEUE: how long a controller hiccup is retried (the grace or time the job has left)."""
    said: str = ""
    """REQUEUE, END: what the decision is about, for people (the start of `message`)."""
