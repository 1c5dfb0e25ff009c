"""Why a run restarted: the one Cause enum that run.json's restart entries, the requeue marker, the
restart policy's Decisions and the profile's `requeue` budgets speak."""

from __future__ import annotations

import enum


class Cause(enum.StrEnum):
    CRASH = "crash"
    """A rank raised or died (not because a peer was lost)."""
    HANG = "hang"
    """A rank's watchdog saw no step for the profile's hang timeout."""
    STARTUP_HANG = "startup_hang"
    """A rank saw no first step within the profile's startup_timeout_s (a node that never joined the
    rendezvous, a hung NCCL init, a data loader stuck at start). Spends the hang budget."""
    NODE_FAILURE = "node_failure"
    """A node was lost or failed the health gate (Slurm's NODE_FAIL)."""
    PREEMPTION = "preemption"
    """Slurm preempted the job, or its signal came with time to spare (scancel --signal)."""
    TIMEOUT = "timeout"
    """The profile's signal came within signal_delay_s of the time limit."""
    REQUEUE = "requeue"
    """Requeued from outside (`scontrol requeue`), no reason recorded."""
    UNKNOWN = "unknown"
    """A restart neither a marker nor accounting explains."""
    RESUBMIT = "resubmit"
    """`slurmkit resubmit`: a new job id for the same run."""

    @property
    def budget_key(self) -> str:
        """The profile's `requeue` budget this cause spends: an external requeue (or one nobody
        recorded a reason for) spends the preemption budget; from inside the job it looks the same."""
        if self is Cause.STARTUP_HANG:
            return Cause.HANG.value
        return Cause.PREEMPTION.value if self in (Cause.REQUEUE, Cause.UNKNOWN) else self.value
