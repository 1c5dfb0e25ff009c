"""Faults injected on purpose (config.faults): the one test-hook object of `task: train`.

Built once from the run's config; the Trainer and the Checkpointer know nothing of it. It adds its
hooks to the Trainer (an error at a step, a transient error in a forward, a hold until a signal)
and gives the Checkpointer's writer its `on_file` (a SIGKILL mid-save, a slow stop save). Faults
that would repeat forever fire only in an incarnation that did not resume (`resumed`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import InjectedFault
from slurmkit.config.train import Faults
from slurmkit.jsontypes import JsonObject
from slurmkit.worker.ft.stop import StopFlag
from slurmkit.worker.ft.watchdog import Watchdog
from slurmkit.worker.train.trainer import Trainer


class InjectedError(RuntimeError):
    """Raised by `faults.error_at_step` and `faults.transient_error_at_steps`: an error on purpose."""


class FaultInjection:
    def __init__(self, faults: Faults, run_dir: str | None, is_main: bool) -> None:
        self.faults, self.is_main = faults, is_main
        self.paths = RunPaths(Path(run_dir)) if run_dir else None
        self.resumed = False
        """This incarnation resumed from a checkpoint (set by its owner once restored)."""
        self.stopping: int | None = None
        """The step the ranks stop at, once they agreed: only that step's own save gets the slow-save
        fault (a periodic save still in flight at the stop is not the stop's). Set by its owner."""
        self._fired: set[int] = set()

    @property
    def in_saves(self) -> bool:
        """Rank 0's writer needs `on_file`."""
        return self.is_main and bool(self.faults.kill_in_save_at_step or self.faults.slow_stop_save_s)

    def on_file(self, step: int, name: str) -> None:
        """In rank 0's writer thread, after each file of a save."""
        if self.resumed:
            return
        if step == self.faults.kill_in_save_at_step:
            print(f"slurmkit: injected SIGKILL during the save of step {step}, after {name}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if step == self.stopping and self.faults.slow_stop_save_s:
            print(f"slurmkit: injected {self.faults.slow_stop_save_s:g} s delay in the stop's save of step {step}",
                  flush=True)
            time.sleep(self.faults.slow_stop_save_s)
            self.stopping = None  # once per save

    def attach(self, trainer: Trainer, flag: StopFlag | None, watchdog: Watchdog | None) -> None:
        """flag: this rank's stop signal, which ends a hold (none: a run without checkpoints is not
        held); watchdog: fed during a hold (held on purpose, not hung)."""
        if self.faults.error_at_step:
            trainer.hooks.append(self._error_hook(self.faults.error_at_step))
        if self.faults.transient_error_at_steps:
            self._transient(trainer, self.faults.transient_error_at_steps)
        if self.faults.hold_at_step and flag is not None and watchdog is not None:
            trainer.hooks.append(self._hold_hook(self.faults.hold_at_step, flag, watchdog))

    @staticmethod
    def _error_hook(step: int) -> Callable[[Trainer, JsonObject], None]:
        def hook(trainer: Trainer, record: Mapping[str, object]) -> None:
            if trainer.state.step == step:
                raise InjectedError(f"injected error at step {step}")

        return hook

    def _first_time(self, step: int) -> bool:
        """Whether the transient fault of `step` has not fired in this run yet: a marker in the run
        folder (else this process's memory) says it has, whatever restarts follow."""
        if step in self._fired:
            return False
        self._fired.add(step)
        return self.paths is None or InjectedFault.fire_once(self.paths, step)

    def _transient(self, trainer: Trainer, steps: list[int]) -> None:
        """The last rank raises once in the forward of each step, before the step's update (as a data
        or device error would)."""
        loss_fn, dist = trainer.loss_fn, trainer.dist

        def failing(model: Any, batch: Any) -> Any:
            step = trainer.state.step + 1  # the step being computed
            if step in steps and dist.rank == dist.world_size - 1 and self._first_time(step):
                raise InjectedError(f"injected transient error at step {step} on rank {dist.rank}")
            return loss_fn(model, batch)

        trainer.loss_fn = failing

    def _hold_hook(self, step: int, flag: StopFlag, watchdog: Watchdog) -> Callable[[Trainer, JsonObject], None]:
        def hook(trainer: Trainer, record: Mapping[str, object]) -> None:
            if trainer.state.step != step or self.resumed:
                return
            if trainer.dist.is_main:
                print(f"slurmkit: injected hold after step {step} until a stop signal", flush=True)
            while not flag.is_set:
                watchdog.progress()
                time.sleep(0.1)

        return hook
