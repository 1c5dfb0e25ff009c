"""Hang detection: a per-rank thread that fires when no step completes for `timeout_s`.

On firing it dumps every thread's stack (faulthandler) to the rank's log, leaves a marker in
the run folder naming the cause, and exits the process with HANG_EXIT_CODE. srun's
--kill-on-bad-exit then stops the other ranks, and the supervisor asks the restart policy what next.

Two watches use it. The step watchdog (the Trainer's) arms once it has measured step times. The
startup watch (StartupWatch) runs from a rank's start to its first completed step, for the
profile's startup_timeout_s (SLURMKIT_STARTUP_TIMEOUT_S; 600 s, torch's own NCCL default; 0: off):
a node that never joins the rendezvous, a hung NCCL init or a data loader stuck at start. A rank
frozen before its first step holds its peers in their first collective, and their startup watches
fire: the allocation is not held to its time limit. Where every rank is frozen (or the run has one
rank) none can fire: rank 0's watch says when it began and when its first step came
(common.markers.StartupWatched), and the job's supervisor watches that from outside
(supervisor.watch).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from slurmkit.common import outcomes
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import HangMarker, StartupWatched
from slurmkit.common.slurm_env import STARTUP_TIMEOUT_ENV

HANG_EXIT_CODE = 75
DEFAULT_STARTUP_TIMEOUT_S = 600.0
FLOOR_S = 10.0
STEP_MULTIPLE = 10.0


def auto_timeout(median_step_s: float, floor_s: float = FLOOR_S) -> float:
    """Default: 10 median steps, never under the floor."""
    return max(floor_s, STEP_MULTIPLE * median_step_s)


class Watchdog:
    def __init__(self, timeout_s: float | None, on_fire: Callable[[float], None] | None = None,
                 poll_s: float = 0.5, armed: bool = False) -> None:
        self.timeout_s = timeout_s  # None: derived from the measured step time once armed
        self.on_fire = on_fire
        self.poll_s = poll_s
        self._last = time.monotonic()
        self._armed = armed  # armed from the start: a fixed timeout, no step time to wait for
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slurmkit-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    @property
    def armed(self) -> bool:
        return self._armed

    def progress(self, median_step_s: float | None = None) -> None:
        """Called at every step boundary (and during long saves)."""
        self._last = time.monotonic()
        if median_step_s is not None and not self._armed:
            self._armed = True
            if self.timeout_s is None:
                self.timeout_s = auto_timeout(median_step_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(4 * self.poll_s)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if not self._armed or self.timeout_s is None:
                continue
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                print(f"slurmkit watchdog: no step progress for {idle:.1f} s (timeout {self.timeout_s:.1f} s); "
                      "dumping stacks and exiting", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                if self.on_fire:
                    self.on_fire(idle)
                sys.stderr.flush()
                os._exit(HANG_EXIT_CODE)


def _rank() -> int:
    """This process's global rank as the launcher set it (torchrun's RANK, srun's, submitit's local)."""
    for name in ("RANK", "SLURM_PROCID", "SUBMITIT_LOCAL_GLOBALID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


class StartupWatch:
    """The startup timeout of this process: begun where a rank will report steps (the Trainer's
    task, a slurmkit.Checkpoint, a framework's callback), ended at its first completed step. One
    per process: a second begin() keeps the first (its clock started earlier)."""

    _current: Watchdog | None = None
    _watched: tuple[RunPaths, StartupWatched] | None = None
    """Rank 0's record of this watch, for the supervisor's outside watch (None on other ranks)."""

    @classmethod
    def begin(cls) -> None:
        if cls._current is not None:
            return
        run_dir, rank = os.environ.get("SLURMKIT_RUN_DIR"), _rank()
        timeout = float(os.environ.get(STARTUP_TIMEOUT_ENV) or DEFAULT_STARTUP_TIMEOUT_S)
        if timeout <= 0 or not run_dir:  # off, or a script run outside slurmkit: nothing to restart it
            return
        paths = RunPaths(Path(run_dir))

        def mark(idle_s: float) -> None:
            HangMarker.now(rank, idle_s, startup=True).write(paths)

        cls._current = Watchdog(timeout, mark, armed=True).start()
        job_id = os.environ.get("SLURM_JOB_ID")
        if rank == 0 and job_id:  # one file per step, not one per rank: the shared filesystem pays for each
            watched = StartupWatched(job_id, outcomes.restart_count(), outcomes.attempt(), time.time(), timeout)
            with contextlib.suppress(OSError):  # a record for the outside watch; the rank's own watch runs regardless
                watched.write(paths)
                cls._watched = (paths, watched)

    @classmethod
    def end(cls) -> None:
        """The first step completed (or training is over): the startup timeout no longer applies."""
        current, cls._current = cls._current, None
        watched, cls._watched = cls._watched, None
        if current is not None:
            current.stop()
        if watched is not None:
            paths, record = watched
            with contextlib.suppress(OSError):
                replace(record, first_step=time.time()).write(paths)
