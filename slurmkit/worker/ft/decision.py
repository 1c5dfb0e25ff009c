"""The typed answer of the restart policy: an action and what it needs; the message is for people only."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

Why = Literal["budget", "deterministic", "slurm_failed", "uncertain", "cancel_mode", "slurm_decides", "unreadable"]
"""Why a run ended or was left as it is (END, REQUEUE): budget: the cause's budget is spent;
deterministic: the same error at the same step twice; slurm_failed: Slurm refused the requeue;
uncertain: the requeue may or may not have gone through;
cancel_mode: preempted under PreemptMode=CANCEL (resume by `slurmkit resubmit`); slurm_decides:
SIGTERM, Slurm ends or requeues the job itself; unreadable: the run's record could not be read
(the supervisor ends the job rather than guess)."""


class Action(enum.StrEnum):
    COMPLETE = "complete"
    """Every rank had finished its work (the step failed while exiting): the run is done."""
    RESTART_IN_JOB = "restart_in_job"
    """A new srun step of the ranks in this allocation (cold: fresh or standby processes)."""
    RESTART_WARM = "restart_warm"
    """The ranks restart inside their own processes, from memory (slurmkit.worker.ft.warm)."""
    REQUEUE = "requeue"
    """The job goes back through Slurm's queue (asked for by the supervisor)."""
    END = "end"
    """The run ends here; `why` says why."""


@dataclass(frozen=True)
class Decision:
    action: Action
    cause: str | None = None
    """crash, hang, node_failure, preemption, timeout, requeue, unknown (None: complete)."""
    step: int | None = None
    """The step the failure or stop happened at, where known."""
    nodes: int | None = None
    """RESTART_IN_JOB: the node count of the next step (None: as many as before)."""
    exclude: tuple[str, ...] = ()
    """RESTART_IN_JOB: held nodes the next step leaves out; REQUEUE: nodes the requeued job avoids."""
    why: Why | None = None
    message: str = ""
    """One line for the job's log; never parsed."""

    @property
    def restarts_here(self) -> bool:
        """The ranks start again inside this allocation (a new step, or warm in their processes)."""
        return self.action in (Action.RESTART_IN_JOB, Action.RESTART_WARM)
