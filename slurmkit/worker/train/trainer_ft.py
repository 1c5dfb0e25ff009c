"""The Trainer's fault tolerance at its step boundaries: checkpoints through the one Checkpointer,
the agreed stop through the StopCoordinator, the hang watchdog, and the live state a warm restart
resumes from.

At every step boundary the ranks' votes (a stop signal seen, and which; a background save still
writing) ride on the step's gradient all-reduce (slurmkit.worker.train.agreement), so they all stop at
the same step and a save commits only once every rank's files are written. The signal handler
itself only sets a flag.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from slurmkit.jsontypes import JsonObject, StateDict
from slurmkit.worker.checkpoint.checkpointer import Checkpointer, HostCopy, StepFiles
from slurmkit.worker.checkpoint.store import trainer_files
from slurmkit.worker.checkpoint.threads import Prefetch, cpu_copy
from slurmkit.worker.ft.stop import StopCoordinator
from slurmkit.worker.ft.watchdog import Watchdog
from slurmkit.worker.process_group import Dist, Ranks
from slurmkit.worker.train.faults import FaultInjection
from slurmkit.worker.train.trainer import Trainer


def rng_state() -> StateDict:
    np_state: Any = np.random.get_state()
    state: StateDict = {
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: StateDict) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class Boundary:
    """A step's start, in what its parameters and optimizer do not hold: where a warm restart from
    the live state resumes (TrainerFT.live_step)."""

    step: int
    meta: JsonObject
    """trainer.pt as a save writes it: the step count, the data position, the scheduler."""
    rng: StateDict
    buffers: dict[str, torch.Tensor]
    """The model's buffers (a forward may change them: batch-norm statistics)."""


def trainer_meta(trainer: Trainer) -> JsonObject:
    return {**trainer.state.as_dict(),
            "scheduler": trainer.scheduler.state_dict() if trainer.scheduler is not None else None}


def _apply_meta(trainer: Trainer, meta: JsonObject, rng: JsonObject | None) -> None:
    if trainer.scheduler is not None and meta.get("scheduler") is not None:
        trainer.scheduler.load_state_dict(meta["scheduler"])
    trainer.state.load(meta)
    if rng is not None:
        set_rng_state(rng)


def _apply(trainer: Trainer, model: JsonObject, optim: JsonObject, meta: JsonObject,
           rng: StateDict | None) -> None:
    _set_weights(trainer, model, optim)
    _apply_meta(trainer, meta, rng)


def _weights(trainer: Trainer) -> StateDict:
    """Model and optimizer state, not copied: under fsdp this rank's DTensor shards, with the
    optimizer's keyed by parameter name (torch.distributed.checkpoint.state_dict), so they reshard."""
    if trainer.sharded:
        model, optim = get_state_dict(trainer.raw_model, trainer.optimizer)
        return {"model": model, "optim": optim}
    return {"model": trainer.raw_model.state_dict(), "optim": trainer.optimizer.state_dict()}


def _set_weights(trainer: Trainer, model: StateDict, optim: StateDict) -> None:
    if trainer.sharded:
        set_state_dict(trainer.raw_model, trainer.optimizer, model_state_dict=model, optim_state_dict=optim)
    else:
        trainer.raw_model.load_state_dict(model)
        trainer.optimizer.load_state_dict(optim)


def _kept(tensors: Iterable[tuple[str, torch.Tensor]], memory: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies on the tensors' own device, into `memory` where it fits: no host sync, no allocation
    each step (cpu_copy() copies to the host, for a save)."""
    for name, t in tensors:
        old = memory.get(name)
        if old is not None and (old.shape, old.dtype, old.device) == (t.shape, t.dtype, t.device):
            old.copy_(t.detach())
        else:
            memory[name] = t.detach().clone()
    return memory


def _drop_step(trainer: Trainer) -> None:
    """What a failed step left behind: its gradients, a stop it asked for, a half-done update."""
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.stop_requested = trainer.updating = False


class TrainerFT:
    def __init__(self, dist: Dist, uri: str, every: int, keep_latest_k: int = 3, async_save: bool = True,
                 hang_timeout_s: float | None = None, on_hang: Any = None, prefetch: Prefetch | None = None,
                 faults: FaultInjection | None = None, on_stop: Callable[[int], None] | None = None,
                 host_copy: bool = False, sharded: bool = False) -> None:
        """on_stop(step): told the agreed stop step before its final save starts; host_copy: every
        rank keeps the last committed state in memory (warm restarts); sharded: the Trainer is FSDP's,
        model and optimizer are saved as DCP shards (every rank its own) and reshard on restore."""
        assert not (host_copy and sharded), "a warm restart keeps whole copies: DDP only"
        self.dist, self.faults, self.on_stop = dist, faults, on_stop
        self.every, self.async_save = every, async_save
        self.watchdog = Watchdog(hang_timeout_s, on_hang).start()
        required = trainer_files("fsdp" if sharded else "ddp")
        self.ckpt = Checkpointer(uri, Ranks.of(dist), required, keep_latest_k=keep_latest_k, prefetch=prefetch,
                                 on_file=faults.on_file if faults and faults.in_saves else None,
                                 heartbeat=self.watchdog.progress, host_copy=host_copy)
        self.stop = StopCoordinator(lambda: self.ckpt.writing)
        self.boundary: Boundary | None = None
        """The current step's start (with host_copy): what a restart from the live state needs."""
        self._mark_memory: dict[str, torch.Tensor] = {}  # the boundary's buffers, the same memory each step
        self.rng_file = f"rng-rank{dist.rank}.pt"
        """This rank's file of a save: its RNG state (rank 0 writes the rest)."""

    # --------------------------------------------------------------- restore

    def restore(self, trainer: Trainer) -> int | None:
        """Load the newest valid checkpoint (slurmkit.worker.checkpoint.checkpointer: rank 0 picks it, every
        rank loads it, one that fails to load on any rank is skipped by all); none left means a
        fresh start from the model's initial state."""
        initial: StateDict = {}

        def load(files: StepFiles) -> None:
            """Every file is read first, then applied: an unreadable one changes nothing."""
            if not initial:
                initial.update(cpu_copy(_weights(trainer)))
            meta = files.load("trainer.pt")
            if trainer.sharded:
                weights = _weights(trainer)  # this run's sharding: DCP fills it, resharding what it reads
                files.load_sharded(weights)
                model, optim = weights["model"], weights["optim"]
            else:
                model, optim = files.load("model.pt"), files.load("optim.pt")
            _apply(trainer, model, optim, meta, files.load(self.rng_file) if self.rng_file in files.names else None)

        found = self.ckpt.restore(load)
        if found is None and initial:  # a failed load may have changed some tensors already
            _set_weights(trainer, initial["model"], initial["optim"])
        step = found[0] if found else None
        if self.faults is not None:
            self.faults.resumed = step is not None
        if self.ckpt.host_copy:
            self.ckpt.keep_start(step, self._state(trainer))
        return step

    def restore_from_host(self, trainer: Trainer) -> HostCopy:
        """Back to the last committed state from this rank's host copy, reading nothing from storage;
        a save in flight is dropped uncommitted."""
        copy = self.ckpt.back_to_committed()
        files = copy.files
        _drop_step(trainer)
        # Copies: load_state_dict keeps CPU tensors as given (and pops keys), so the steps that follow
        # would change the host copy itself.
        _apply(trainer, files["model.pt"], cpu_copy(files["optim.pt"]), cpu_copy(files["trainer.pt"]),
               files[self.rng_file])
        return copy

    def mark(self, trainer: Trainer) -> None:
        """At a step's start: what a restart from the live state needs besides weights and optimizer
        (a few KB, and the buffers: far less than a cpu_copy)."""
        self.boundary = Boundary(trainer.state.step, cpu_copy(trainer_meta(trainer)), rng_state(),
                                 _kept(trainer.raw_model.named_buffers(), self._mark_memory))

    def live_step(self, trainer: Trainer) -> int | None:
        """The step this rank's live state stands at, if it is that step's start: the failure came
        before the step's update (in its data, forward, backward or gradient all-reduce). None after
        or inside the update: the parameters are ahead of the boundary, or half changed."""
        b = self.boundary
        if b is None or trainer.updating or trainer.state.step != b.step:
            return None
        return b.step

    def restore_live(self, trainer: Trainer) -> int:
        """Back to the start of the failed step in place: the weights and optimizer are as they were
        (no update ran), so only the boundary's state comes back. A save in flight stays: every rank
        started it at the same step and none was committing (every rank had begun the next step)."""
        b = self.boundary
        assert b is not None and self.live_step(trainer) == b.step, "live_step() said the live state is a step's start"
        _drop_step(trainer)
        _apply_meta(trainer, cpu_copy(b.meta), b.rng)
        for name, buf in trainer.raw_model.named_buffers():
            buf.copy_(b.buffers[name])
        return b.step

    # --------------------------------------------------------------- saving

    def _state(self, trainer: Trainer, whole: bool = True) -> StateDict:
        """The live state as a save names it (not yet copied); without `whole`, this rank's rng only."""
        state: StateDict = {self.rng_file: rng_state()}
        if whole:
            weights = _weights(trainer)
            state["model.pt"], state["optim.pt"] = weights["model"], weights["optim"]
            state["trainer.pt"] = trainer_meta(trainer)
        return state

    def save(self, trainer: Trainer, wait: bool) -> None:
        """This rank's share of a save: rank 0 writes model, optimizer and trainer state, every rank its
        rng. With a host copy every rank takes the whole state, kept in memory once the save commits.
        Sharded (fsdp): every rank writes its shard of model and optimizer, rank 0 the trainer state."""
        files, sharded, mine = self._save_args(trainer)
        self.ckpt.save(trainer.state.step, files, wait or not self.async_save, mine=mine, sharded=sharded)

    def _save_args(self, trainer: Trainer) -> tuple[StateDict, StateDict | None, tuple[str, ...] | None]:
        """What save() hands the Checkpointer: its files, its sharded state, the files this rank writes."""
        if trainer.sharded:
            files = {self.rng_file: rng_state(), **({"trainer.pt": trainer_meta(trainer)} if self.dist.is_main else {})}
            w = _weights(trainer)
            return files, {"model": w["model"], "optim": w["optim"]}, None
        files = self._state(trainer, self.dist.is_main or self.ckpt.host_copy)
        return files, None, None if self.dist.is_main else (self.rng_file,)

    # --------------------------------------------------------------- the step boundary

    def attach(self, trainer: Trainer) -> None:
        """Vote at every step boundary and act on the agreement after each step."""
        self.stop.ride(trainer)
        trainer.hooks.append(self.on_step_end)
        if self.ckpt.host_copy:
            trainer.before_step.append(self.mark)

    def on_step_end(self, trainer: Trainer, record: JsonObject) -> None:
        stall_before = self.ckpt.stall_s
        try:
            self._step_end(trainer)
        finally:
            record["ckpt_stall_s"] = self.ckpt.stall_s - stall_before

    def _step_end(self, trainer: Trainer) -> None:
        self.watchdog.progress(None if self.watchdog.armed else trainer.median_step_s(20))
        agreed = self.stop.read(trainer)
        self.ckpt.at_boundary(agreed.writing)
        if self.every:  # after the first step: the optimizer's state exists now
            self.ckpt.reserve(lambda: self._save_args(trainer)[:2])
        if agreed.stop:
            # Every rank stops at this same step and takes part in the final save.
            if self.faults is not None:
                self.faults.stopping = trainer.state.step
            if self.on_stop is not None:
                self.on_stop(trainer.state.step)
            self.save(trainer, wait=True)
            self.stop.stop(trainer.state.step, agreed.stop)
            trainer.stop_requested = True
        elif self.every and trainer.state.step % self.every == 0:
            self.save(trainer, wait=False)
        self.watchdog.progress()

    def finish(self) -> None:
        """Commit a save still in flight; raise its error if it failed."""
        self.ckpt.finish()
        self.watchdog.stop()
