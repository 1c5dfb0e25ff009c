"""Stop signals for runs without step boundaries (command, callable, ray): interrupt, requeue, exit.

`task: train` stops all ranks at an agreed step (slurmkit.worker.ft.incarnation). A shell command, a
user's callable or a Ray driver has no step to wait for, so here the handler raises in the main
thread, as SIGINT's KeyboardInterrupt does. On the profile's signal (preemption or the time limit)
the job's supervisor requeues the job within the profile's budget and the work starts again in the
next allocation; on SIGTERM the run stops, and is requeued only where Slurm is preempting it. Rank 0
records the stop (stop.ended); the supervisor decides. These handlers replace submitit's:
its USR2 handler guesses "timed out" from wall-clock time and then fails a non-checkpointable run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from slurmkit.worker.checkpoint import AgreedStop
from slurmkit.worker.ft.stop import ended, install_handlers


class Interrupted(BaseException):
    """Raised by the stop handlers; a BaseException so that `except Exception` in user code lets it pass."""

    def __init__(self, requeue: bool) -> None:
        super().__init__("requeue signal" if requeue else "SIGTERM")
        self.requeue = requeue


def _raising_handler(requeue: bool) -> Any:
    """A signal handler that raises Interrupted (a stop for requeue, or for good)."""
    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(requeue)

    return handler


@contextmanager
def requeue_on_signal(run_dir: str) -> Iterator[None]:
    """Under Slurm and the local profile: the stop signals interrupt the body; then the stop is recorded for the job's
    supervisor (stop.ended), and the rank exits without a result.
    A function with a slurmkit.Checkpoint replaces these handlers by its flag, and stops at the
    step its ranks agree on (AgreedStop), its state saved; that is requeued the same way."""
    if os.environ.get("SUBMITIT_EXECUTOR") in ("slurm", "local"):  # the local profile rehearses Slurm's
        install_handlers(_raising_handler(True), _raising_handler(False))
    try:
        yield
    except (Interrupted, AgreedStop) as stop:
        step = stop.step if isinstance(stop, AgreedStop) else None
        line, status = ended(run_dir, step, stop.requeue)
        print(f"slurmkit: {line}", flush=True)
        raise SystemExit(status) from None  # not an exception: no result (or error) for this incarnation
