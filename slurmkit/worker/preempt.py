"""Stop signals: the handlers only set flags; ranks act on them together at a step boundary.

- The profile's signal (USR2 by default; NCCL uses USR1) means "save, then requeue": Slurm sends
  it before the time limit, and on preemption where the admin enables the user signal.
- SIGTERM means "save, then exit": Slurm sends it on scancel, on `scontrol requeue`, on
  preemption without the user signal, and at the limit, then SIGKILL after KillWait/GraceTime.
  Slurm decides whether the job comes back, except on preemption: a job that exits within its
  GraceTime is COMPLETED for Slurm, so rank 0 asks for the requeue (requeue.after_stop).

They replace submitit's handlers: its USR2 handler checkpoints on rank 0 only, from inside the
handler, and guesses timeout vs preemption from wall-clock time; its SIGTERM handler ignores it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from enum import IntEnum
from types import FrameType

DEFAULT_SIGNAL = "USR2"


class Stop(IntEnum):
    """What a rank saw. Ordered: the ranks agree on the largest (an all-reduce MAX), so one rank's
    SIGTERM outranks another's requeue signal."""

    NONE = 0
    REQUEUE = 1
    TERMINATE = 2


def install_handlers(on_requeue: Callable[[int, FrameType | None], None],
                     on_terminate: Callable[[int, FrameType | None], None], name: str | None = None) -> None:
    """The profile's signal (SLURMKIT_SIGNAL, else USR2) means requeue; SIGTERM, unless it is that signal,
    means terminate."""
    requeue_sig = getattr(signal, f"SIG{name or os.environ.get('SLURMKIT_SIGNAL', DEFAULT_SIGNAL)}")
    signal.signal(requeue_sig, on_requeue)
    if requeue_sig != signal.SIGTERM:
        signal.signal(signal.SIGTERM, on_terminate)


class StopFlag:
    def __init__(self) -> None:
        self.kind = Stop.NONE

    def install(self, name: str | None = None) -> StopFlag:
        install_handlers(self._requeue, self._terminate, name)
        return self

    def _requeue(self, signum: int, frame: FrameType | None) -> None:
        self.kind = max(self.kind, Stop.REQUEUE)

    def _terminate(self, signum: int, frame: FrameType | None) -> None:
        self.kind = Stop.TERMINATE

    @property
    def is_set(self) -> bool:
        return self.kind != Stop.NONE
