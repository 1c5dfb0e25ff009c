"""A Lightning script, unmodified, gets slurmkit's agreed stop (docs/frameworks.md).

Lightning loads external callbacks from the entry points `pytorch_lightning.callbacks_factory` and
`lightning.pytorch.callbacks_factory`; slurmkit declares one of each (pyproject.toml), so every
Trainer a command run's script makes carries an AgreedStopCallback, with no line of it changed.
Outside a slurmkit command run the factories give nothing.

What the callback does:
- At the Trainer's making, slurmkit's StopFlag takes the profile's signal and SIGTERM (a handler
  only sets the flag), and the rank's worker is told the script agrees stops (markers.CommandStop):
  it then passes the signal on rather than ending the script.
- Lightning's own requeue handler never goes in: Lightning installs it only where the signal has no
  handler yet. So nothing but the job's supervisor runs `scontrol requeue`: one requeue, never two.
- After the training batches the ranks vote in a small all-reduce that runs in the background
  (ft.stop.LaggedVote: no step waits on it, a vote about every 50 ms). At the agreed stop every rank
  saves Lightning's own "hpc" checkpoint (`hpc_ckpt_N.ckpt` in the Trainer's default_root_dir:
  Lightning's collective save, at one step on every rank), and the script ends with status 0
  and the stop recorded for the supervisor, which requeues within the profile's budget.
- Straggler scores: each rank's own work per batch (under DDP, less the gradient all-reduce's
  wait: ft.straggler.DdpOwnTime) is shared over the vote's group (ft.straggler.GroupPaces), and
  rank 0 names a slow rank as the Trainer's runs do (docs/fault-tolerance.md, "Health").
- What the LightningModule logs (`self.log`) reaches the run's logged.jsonl and trackers, every
  `log_every_n_steps` and after each validation (slurmkit.tracking.log): `sweep results` and the
  report show it.
- Once `fit` is done the signals do what they did before the Trainer was made (ScriptStop.release):
  a script that goes on after fit is ended by SIGTERM and `slurmkit cancel` as any script is.
- The requeued job's Trainer is again under Slurm, and Lightning itself resumes from the newest
  hpc checkpoint when `fit` is given no ckpt_path: no finished optimizer step runs twice.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from slurmkit.common.markers import COMMAND_STOP_ENV
from slurmkit.worker import tracking
from slurmkit.worker.ft.stop import LaggedVote, ScriptStop, Stop
from slurmkit.worker.ft.straggler import DdpOwnTime


def pytorch_lightning_callbacks() -> list[Any]:
    """The entry point `pytorch_lightning.callbacks_factory`."""
    return _callbacks("pytorch_lightning")


def lightning_callbacks() -> list[Any]:
    """The entry point `lightning.pytorch.callbacks_factory` (the unified `lightning` package)."""
    return _callbacks("lightning.pytorch")


def _callbacks(package: str) -> list[Any]:
    if not os.environ.get(COMMAND_STOP_ENV):
        return []
    base = importlib.import_module(package).Callback  # the package that asked: its Trainer checks the type
    return [type("AgreedStopCallback", (_AgreedStop, base), {})()]


class _AgreedStop:
    """The agreed stop at Lightning's batch boundary (mixed into the asking package's Callback)."""

    def __init__(self) -> None:
        self.script = ScriptStop()  # now the rank's worker passes the signal on
        self.votes = LaggedVote(self.script.flag)
        self.ddp = DdpOwnTime()

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Under DDP, straggler scores time each batch less its gradient all-reduce's wait."""
        if self.ddp.install(trainer.strategy.model):
            self.votes.timed = False

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.ddp.batch_start()

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self.ddp.after_backward()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.ddp.batch_end()
        self.script.stepped()
        if trainer.global_step % max(1, int(trainer.log_every_n_steps)) == 0:
            _log(trainer, self.votes.scored())
        agreed = self.votes.vote()
        if agreed == Stop.NONE:
            return
        self.votes.drain()
        step = int(trainer.global_step)
        trainer.save_checkpoint(trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir))
        self.script.end(step, agreed)  # the script ends here, as at a slurmkit.Checkpoint's agreed stop

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        _log(trainer, {})

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """fit is done: no batch reads the flag again, so the signals do what they did before (a
        script that goes on after fit is ended by a cancel, not left running)."""
        self.votes.drain()  # on every rank, as each ends fit at the same step: no vote left in flight
        self.script.release()


def _log(trainer: Any, scored: dict[str, float]) -> None:
    """What the LightningModule logged (self.log), as Lightning's own loggers get it, to the run's
    logged.jsonl and trackers (slurmkit.tracking.log; rank 0), with rank 0's straggler score."""
    values = {name: float(v) for name, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 0)() == 1}
    values.update(scored)
    if values:
        tracking.log(values, int(trainer.global_step))
