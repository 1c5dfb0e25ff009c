"""Hang detection: a per-rank thread that fires when no step completes for `timeout_s`.

On firing it dumps every thread's stack (faulthandler) to the rank's log, leaves a marker in
the run folder naming the cause, and exits the process with HANG_EXIT_CODE. srun's
--kill-on-bad-exit then stops the other ranks, and the supervisor asks the restart policy what next.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable

HANG_EXIT_CODE = 75
FLOOR_S = 10.0
STEP_MULTIPLE = 10.0


def auto_timeout(median_step_s: float, floor_s: float = FLOOR_S) -> float:
    """Default: 10 median steps, never under the floor."""
    return max(floor_s, STEP_MULTIPLE * median_step_s)


class Watchdog:
    def __init__(self, timeout_s: float | None, on_fire: Callable[[float], None] | None = None,
                 poll_s: float = 0.5) -> None:
        self.timeout_s = timeout_s  # None: derived from the measured step time once armed
        self.on_fire = on_fire
        self.poll_s = poll_s
        self._last = time.monotonic()
        self._armed = False
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
