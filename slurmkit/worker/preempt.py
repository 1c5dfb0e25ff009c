"""The stop signal: the handler only sets a flag; ranks act on it together at a step boundary.

It replaces submitit's own USR2 handler, which checkpoints on rank 0 only, from inside the
handler, and guesses timeout vs preemption from wall-clock time.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

DEFAULT_SIGNAL = "USR2"  # not USR1: NCCL uses it


class StopFlag:
    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self, name: str | None = None) -> StopFlag:
        sig = getattr(signal, f"SIG{name or os.environ.get('SLURMKIT_SIGNAL', DEFAULT_SIGNAL)}")
        signal.signal(sig, self._handler)
        return self

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    @property
    def is_set(self) -> bool:
        return self.signum is not None
