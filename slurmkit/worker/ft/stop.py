"""Stop signals, and the agreed stop: the handlers only set flags; ranks act on them together at a
step boundary (StopCoordinator), the Trainer's and a slurmkit.Checkpoint function's alike.

- The profile's signal (USR2 by default; NCCL uses USR1) means "save, then requeue": Slurm sends
  it before the time limit, and on preemption where the admin enables the user signal.
- SIGTERM means "save, then exit": Slurm sends it on scancel, on `scontrol requeue`, on
  preemption without the user signal, and at the limit, then SIGKILL after KillWait/GraceTime.
  Slurm decides whether the job comes back, except on preemption: a job that exits within its
  GraceTime is COMPLETED for Slurm, so the job's supervisor asks for the requeue.

Once the ranks have stopped (and saved), rank 0 records the typed end of the step (worker.interrupt.ended,
common.markers.Stopped); the supervisor, the one decider, reads it and requeues or not.

They replace submitit's handlers: its USR2 handler checkpoints on rank 0 only, from inside the
handler, and guesses timeout vs preemption from wall-clock time; its SIGTERM handler ignores it.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from slurmkit.common.markers import COMMAND_STOP_ENV, CommandStop
from slurmkit.worker import at_exit
from slurmkit.worker.ft.straggler import BoundaryClock, GroupPaces
from slurmkit.worker.ft.watchdog import StartupWatch

if TYPE_CHECKING:  # the Trainer imports torch; this module is imported by torch-free code too
    from slurmkit.worker.process_group import Ranks
    from slurmkit.worker.train.trainer import Trainer

DEFAULT_SIGNAL = "USR2"


class Stop(IntEnum):
    """What a rank saw. Ordered: the ranks agree on the largest (an all-reduce MAX), so one rank's
    SIGTERM outranks another's requeue signal."""

    NONE = 0
    REQUEUE = 1
    TERMINATE = 2


def requeue_signal(name: str | None = None) -> signal.Signals:
    """The signal that means "save, then requeue": `name`, else the profile's (SLURMKIT_SIGNAL), else USR2."""
    return signal.Signals[f"SIG{name or os.environ.get('SLURMKIT_SIGNAL', DEFAULT_SIGNAL)}"]


Handlers = dict[signal.Signals, Any]


def install_handlers(on_requeue: Callable[[int, FrameType | None], None],
                     on_terminate: Callable[[int, FrameType | None], None], name: str | None = None) -> Handlers:
    """The profile's signal (requeue_signal) means requeue; SIGTERM, unless it is that signal, means
    terminate. The handlers they had before, by signal."""
    requeue_sig = requeue_signal(name)
    before = {requeue_sig: signal.signal(requeue_sig, on_requeue)}
    if requeue_sig != signal.SIGTERM:
        before[signal.SIGTERM] = signal.signal(signal.SIGTERM, on_terminate)
    return before


class StopFlag:
    def __init__(self) -> None:
        self.kind = Stop.NONE
        self.before: Handlers = {}
        """The handlers the signals had before install(), which uninstall() puts back."""

    def install(self, name: str | None = None) -> StopFlag:
        self.before = install_handlers(self._requeue, self._terminate, name)
        return self

    def uninstall(self) -> None:
        """The signals do what they did before install() (a signal flagged meanwhile is the caller's)."""
        for signum, handler in self.before.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self.before = {}

    def _requeue(self, signum: int, frame: FrameType | None) -> None:
        self.kind = max(self.kind, Stop.REQUEUE)

    def _terminate(self, signum: int, frame: FrameType | None) -> None:
        self.kind = Stop.TERMINATE

    @property
    def is_set(self) -> bool:
        return self.kind != Stop.NONE


class AgreedStop(BaseException):  # noqa: N818 - a control-flow signal, like SystemExit
    """Raised by slurmkit.Checkpoint.step on every rank at the agreed step, after the final save; the
    run's entry turns it into the requeue (slurmkit.worker.interrupt)."""

    def __init__(self, requeue: bool, step: int) -> None:
        super().__init__(f"stopped at step {step}")
        self.requeue, self.step = requeue, step


@dataclass(frozen=True)
class Agreed:
    """What every rank read at one step boundary: the largest of each rank's votes."""

    stop: Stop
    """A stop signal some rank saw (the strongest)."""
    writing: bool
    """Some rank's share of the background save is still being written: it cannot commit yet."""


class StopCoordinator:
    """The one agreement at a step boundary: each rank votes (the stop signal it saw; whether its
    share of a save is still writing) and every rank acts on the largest of each, so all stop at the
    same step and a save commits only once every rank has written. The votes ride on the Trainer's
    gradient all-reduce (`ride`, slurmkit.worker.train.agreement) or, where there is none, go in one small
    all-reduce (`agree`)."""

    def __init__(self, writing: Callable[[], bool], flag: StopFlag | None = None) -> None:
        """writing(): this rank's share of a save is still being written."""
        self.flag = flag or StopFlag().install()
        self._writing = writing
        self.kind = Stop.NONE
        """The stop as the ranks agreed on it (NONE until they did)."""
        self.stopped_at: int | None = None

    def votes(self) -> tuple[int, int]:
        return int(self.flag.kind), int(self._writing())

    def ride(self, trainer: Trainer) -> None:
        """Vote through the Trainer's step (its `agreed` holds the result after each step)."""
        trainer.votes["stop"] = lambda: int(self.flag.kind)
        trainer.votes["writing"] = lambda: int(self._writing())

    @staticmethod
    def read(trainer: Trainer) -> Agreed:
        return Agreed(Stop(trainer.agreed["stop"]), bool(trainer.agreed["writing"]))

    def agree(self, ranks: Ranks) -> Agreed:
        """One small all-reduce of the votes (a function's step, with no gradients to ride on)."""
        stop, writing = ranks.max(list(self.votes()))
        return Agreed(Stop(stop), bool(writing))

    def stop(self, step: int, kind: Stop) -> None:
        """Every rank stops at `step`, for `kind`."""
        self.kind, self.stopped_at = kind, step


VOTE_EVERY_S = 0.05
"""How often a framework's ranks vote on the stop, at most: a vote every step of a 4 ms step would
cost a few per cent of it; at this cadence the stop still comes within a tenth of a second."""
MAX_VOTE_GAP = 1000


class LaggedVote:
    """The stop vote of a framework's step (Lightning's, the HF Trainer's: slurmkit.worker.frameworks),
    all-reduced in the background over a gloo group of its own, so no step waits on it and a GPU
    run's NCCL stream never carries it. A vote is read at the next voting boundary, which starts
    the next vote; the ranks vote every k boundaries, k agreed in the vote before (the smallest any
    rank asked for: a vote about every VOTE_EVERY_S by its own step time). Every rank reads the same
    result at the same boundary, so all stop at one step."""

    def __init__(self, flag: StopFlag) -> None:
        self.flag = flag
        self.paces: GroupPaces | None = None
        """The straggler readings riding on this vote's group (made with it)."""
        self._clock = BoundaryClock()
        self.timed = True
        """The time between boundaries is this rank's own work (False: the framework's step is timed
        another way, straggler.DdpOwnTime)."""
        self._group: Any = None
        self._pending: tuple[Any, Any] | None = None
        self._due = False
        self._started = False
        self._boundary = self._next = self._voted_at = 0
        self._voted_time = 0.0

    def vote(self) -> Stop:
        """At every step boundary, on every rank: the stop the ranks agreed on (NONE until they do).
        The time from the last boundary to this one is this rank's own work (straggler scores); the
        vote's own wait is not."""
        if self.timed:
            self._clock.arrived()
        try:
            return self._vote()
        finally:
            self._clock.left()

    def _vote(self) -> Stop:
        import torch
        import torch.distributed as tdist

        if not self._started:  # every rank makes the group at its first boundary: the same collective call
            self._started = True
            if tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1:
                self._group = tdist.new_group(backend="gloo")
                self.paces = GroupPaces(tdist.get_rank(), tdist.get_world_size(), os.environ.get("SLURMKIT_RUN_DIR"))
        self._boundary += 1
        if self._group is None:
            return self.flag.kind
        if self._boundary < self._next:
            return Stop.NONE
        now = time.monotonic()
        step_s = (now - self._voted_time) / max(1, self._boundary - self._voted_at) if self._voted_at else 0.0
        wanted = min(MAX_VOTE_GAP, max(1, math.ceil(VOTE_EVERY_S / step_s))) if step_s > 0 else 1
        self._voted_time, self._voted_at = now, self._boundary
        agreed, gap = self.drain()
        self._next = self._boundary + gap
        if self._due and self.paces is not None:  # every rank read the same vote: all exchange here
            self.paces.exchange(self._group)
        due = self.paces.due() if self.paces is not None else 0
        votes = torch.tensor([int(self.flag.kind), -wanted, due], dtype=torch.int64)  # max of -k: the smallest k
        self._pending = (tdist.all_reduce(votes, op=tdist.ReduceOp.MAX, group=self._group, async_op=True), votes)
        return agreed

    def scored(self) -> dict[str, float]:
        """Rank 0's lowest straggler score at the last reading, for the run's trackers (none elsewhere)."""
        namer = self.paces.namer if self.paces is not None else None
        return {"straggler_score_min": namer.lowest} if namer is not None and namer.lowest is not None else {}

    def drain(self) -> tuple[Stop, int]:
        """The vote in flight, waited for (before the ranks stop: none is left behind): the stop, and
        how many boundaries until the next vote."""
        if self._pending is None:
            return Stop.NONE, 1
        work, votes = self._pending
        self._pending = None
        work.wait()
        self._due = bool(votes[2])
        return Stop(int(votes[0])), int(-votes[1])


class ScriptStop:
    """A user script's side of the agreed stop, wherever it steps (a slurmkit.Checkpoint, a
    framework's callback: slurmkit.worker.frameworks): the signal only sets `flag`. Made in a
    command run's script, it tells the rank's worker that the script agrees stops, and the worker
    then passes the signal on rather than ending the script (worker.command)."""

    def __init__(self) -> None:
        self.flag = StopFlag().install()  # now: a signal before the first step is not lost
        StartupWatch.begin()  # until stepped(): the profile's startup_timeout_s
        marker = os.environ.get(COMMAND_STOP_ENV)
        self.marker = Path(marker) if marker else None
        if self.marker is not None:
            CommandStop().write(self.marker)
        at_exit.install()  # the script's exit, past its last line, must not abort (slurmkit.worker.at_exit)

    @staticmethod
    def stepped() -> None:
        """A step completed on this rank (its boundary passed): the startup timeout is over."""
        StartupWatch.end()

    def release(self) -> None:
        """Training is over (the framework's Trainer finished): no step will read the flag again, so
        the signals do what they did before (SIGTERM ends the script), the rank's worker is told the
        script no longer agrees stops (it terminates it, as any script), and a signal that came
        after the last step is delivered now, to that handler."""
        self.flag.uninstall()
        StartupWatch.end()
        if self.marker is not None and (found := CommandStop.read(self.marker)) is not None and found.step is None:
            self.marker.unlink(missing_ok=True)
        if self.flag.is_set:
            signal.raise_signal(requeue_signal() if self.flag.kind == Stop.REQUEUE else signal.SIGTERM)

    def end(self, step: int, kind: Stop) -> NoReturn:
        """The ranks stopped at `step` and saved it: a command's script exits 0 here and its worker
        acts on the stop; a function's run gets AgreedStop."""
        requeue = kind == Stop.REQUEUE
        if self.marker is not None:
            CommandStop(step, requeue).write(self.marker)
            raise SystemExit(0)
        raise AgreedStop(requeue, step)
