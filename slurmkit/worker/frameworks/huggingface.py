"""The Hugging Face Trainer's agreed stop: one callback (docs/frameworks.md).

    from slurmkit.huggingface import AgreedStopCallback
    trainer = Trainer(model, args, train_dataset=data, callbacks=[AgreedStopCallback()])
    trainer.train(resume_from_checkpoint=get_last_checkpoint(args.output_dir))   # the usual resume

The profile's signal only sets slurmkit's flag. After each optimizer step (`on_step_end`) the
ranks vote in a small all-reduce run in the background (ft.stop.LaggedVote: a vote about every
50 ms); at the agreed stop the callback asks the Trainer for a save
and the end of training at that step (its TrainerControl), so the Trainer writes its own
`checkpoint-N` in output_dir on every rank's behalf as a `save_steps` save would. Once saved
(`on_save`) the stop is recorded and the script ends with status 0 (a command run's; a function
run's entry gets the AgreedStop exception), and the job's supervisor requeues. The next incarnation's
`get_last_checkpoint` finds checkpoint-N: no step runs twice. What the Trainer logs reaches the
run's logged.jsonl and trackers (`on_log`): `sweep results` and the report show it.
"""

from __future__ import annotations

from typing import Any

from slurmkit.common.metrics import numbers
from slurmkit.worker import tracking
from slurmkit.worker.ft.stop import LaggedVote, ScriptStop, Stop

try:
    from transformers import TrainerCallback
except ImportError:  # no Trainer to call it then; the module still imports (docs, type checks)
    TrainerCallback = object


class AgreedStopCallback(TrainerCallback):
    """slurmkit's agreed stop for a transformers Trainer: add it to `callbacks=`."""

    def __init__(self) -> None:
        self.script = ScriptStop()  # a command's script: its worker now passes the signal on
        self.votes = LaggedVote(self.script.flag)
        self.agreed = Stop.NONE

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.script.stepped()
        agreed = self.votes.vote()
        if agreed != Stop.NONE and self.agreed == Stop.NONE:
            self.votes.drain()
            self.agreed = agreed
            control.should_save = True  # the Trainer's own save of this step, next
            control.should_training_stop = True
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """What the Trainer logs (loss, learning rate, eval metrics) to the run's logged.jsonl and
        trackers (slurmkit.tracking.log; rank 0), with rank 0's straggler score."""
        values = {**numbers(logs or {}), **self.votes.scored()}
        if values:
            tracking.log(values, int(state.global_step))
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Training is done: the signals do what they did before (ScriptStop.release)."""
        if self.agreed == Stop.NONE:
            self.votes.drain()
            self.script.release()
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.agreed == Stop.NONE:
            return control
        self.script.end(int(state.global_step), self.agreed)
