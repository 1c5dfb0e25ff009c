"""Checkpoints and the coordinated stop for functions submitted from Python.

    def train(steps: int, ckpt: slurmkit.Checkpoint) -> float:
        rank, world, device = slurmkit.distributed.init()
        state = ckpt.restore() or {"step": 0, "w": torch.zeros(8)}
        for step in range(state["step"], steps):
            ...                                      # one training step, all-reduce as you like
            state = {"step": step + 1, "w": w}
            ckpt.step(step + 1, state)               # the step boundary
        return float(w.sum())

A function with a parameter annotated `slurmkit.Checkpoint` gets one from the run's entry, on
the run's checkpoint URI (profile checkpoint_root, else the run folder). Without one, the module
functions `slurmkit.checkpoint.restore()`, `step()` and `save()` use a default Checkpoint.

What it gives, as `task: train` has it: step-N folders valid only once their commit marker is
written (slurmkit.worker.checkpoint.store), a save every `every` steps written in the background, the
newest `keep_latest_k` valid steps kept, and the stop: the signal handler only sets a flag; at
the next `step()` every rank agrees (one small all-reduce), the state of that step is saved and
committed, and the job's supervisor requeues within the profile's budget. The next incarnation's `restore()`
returns that state, so no finished step is lost. Rank 0 writes a plain state: the ranks of a
data-parallel function hold the same one. A sharded state (FSDP2's DTensors) is written by every
rank, its own shard, through torch.distributed.checkpoint, and `restore(like=state)` reshards it
to the run's ranks (slurmkit.worker.checkpoint.sharded). Torch is imported on first use.

In a `command` run's script (`python train.py` under srun or torchrun, the script's own
init_process_group()), a Checkpoint tells the rank's worker that the script agrees stops
(slurmkit.worker.command): the stop signal then only sets the flag, and at the agreed step, once
its state is saved, the script exits with status 0 (SystemExit) and the worker records the stop.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from slurmkit.jsontypes import StateDict
from slurmkit.worker import at_exit, distributed
from slurmkit.worker.checkpoint.checkpointer import Checkpointer, StepFiles, checkpoint_uri, dcp_io_module
from slurmkit.worker.checkpoint.store import CheckpointError, CheckpointStore
from slurmkit.worker.ft import straggler
from slurmkit.worker.ft.stop import AgreedStop, ScriptStop, StopCoordinator
from slurmkit.worker.process_group import Ranks

STATE_FILE = "state.pt"
SHARDED_KEY = "state"
"""A sharded state's top-level key in its DCP checkpoint (DCP takes a dict; a state need not be one)."""
DEFAULT_EVERY = 100
__all__ = ["AgreedStop", "Checkpoint", "default", "finish", "restore", "save", "step", "wants_checkpoint"]


class Checkpoint:
    def __init__(self, uri: str | None = None, every: int = DEFAULT_EVERY, keep_latest_k: int = 3,
                 async_save: bool = True) -> None:
        """uri: an fsspec URI; unset, the run's ($SLURMKIT_CHECKPOINT_URI, else the run folder's)."""
        self.uri, self.every, self.keep, self.async_save = uri or _run_folder_uri(), every, keep_latest_k, async_save
        self.script = ScriptStop()
        self._clock = straggler.BoundaryClock()
        self._pace: straggler.Sharing | None = None
        self._parts: tuple[Checkpointer, StopCoordinator] | None = None
        self.rank_state: Any | None = None
        """This rank's own part of the restored step (`rank_state=` of its save), or None."""

    @property
    def _ckpt(self) -> Checkpointer:
        return self._made()[0]

    def _made(self) -> tuple[Checkpointer, StopCoordinator]:
        """The Checkpointer and StopCoordinator, made on first use, on the ranks of the process group
        as it is at each call: a function may bring its group up after it first restored."""
        ranks = Ranks.current()
        at_exit.keep_default_group()  # the script's DDP reducer must never be the one to free it
        if self._parts is None:
            # Nothing required by name: a step holds state.pt, or a sharded state's DCP files.
            ckpt = Checkpointer(self.uri, ranks, keep_latest_k=self.keep)
            self._parts = ckpt, StopCoordinator(lambda: ckpt.writing, self.script.flag)
        self._parts[0].ranks = ranks
        return self._parts

    @property
    def stop_requested(self) -> bool:
        """This rank was asked to stop (the profile's signal, or SIGTERM): the ranks agree and save at
        the next `step`. A loop that waits on something else (a server, another part of a
        heterogeneous run, which may be stopping too) checks it, so as to reach that boundary."""
        return self.script.flag.is_set

    @property
    def store(self) -> CheckpointStore:
        """The step-N folders on storage."""
        return self._ckpt.store

    @property
    def resumed_step(self) -> int | None:
        return self._ckpt.resumed_step

    def restore(self, like: object = None) -> Any | None:
        """The newest valid state (rank 0 picks the step, every rank loads it), or None: a fresh start.
        This rank's own part of it, where it saved one, is then `rank_state`. A sharded state (one
        holding DTensors: FSDP2's, from torch.distributed.checkpoint.state_dict.get_state_dict) is
        loaded into `like`, this run's state of the same keys, and resharded to its layout whatever
        number of ranks saved it; pass it, and apply what comes back (set_state_dict)."""
        ckpt = self._ckpt
        mine = _rank_file(ckpt.ranks.rank)

        def load(files: StepFiles) -> Any:
            self.rank_state = files.load(mine) if mine in files.names else None
            if not files.sharded:
                return files.load(STATE_FILE)
            if like is None:
                raise CheckpointError(f"step-{files.step} holds a sharded state: restore(like=state) takes this "
                                      "run's state (get_state_dict's) to load it into")
            wrapped = {SHARDED_KEY: like}
            files.load_sharded(wrapped)
            return wrapped[SHARDED_KEY]

        found = ckpt.restore(load)
        return found[1] if found else None

    def save(self, step: int, state: Any | Callable[[], Any], wait: bool = False, rank_state: object = None) -> None:
        """Save `state` as step-N, on every rank: in the background, committed at a later boundary, or
        now with `wait`. A function returning the state is called when the save is due. A plain state
        (every rank holds the same) is written by rank 0; a sharded one (DTensors anywhere in it) by
        every rank, its own shard (torch.distributed.checkpoint). `rank_state`: this rank's own part
        (its RNG, its data position), written by each rank."""
        files, sharded = self._files(state() if callable(state) else state, rank_state)
        self._ckpt.save(step, files, wait or not self.async_save, sharded=sharded)

    def _files(self, value: object, rank_state: object) -> tuple[StateDict, StateDict | None]:
        """What a save of `value` hands the Checkpointer: this rank's files, and the sharded state."""
        ckpt = self._ckpt
        files = {_rank_file(ckpt.ranks.rank): rank_state} if rank_state is not None else {}
        if dcp_io_module().is_sharded(value):
            return files, {SHARDED_KEY: value}
        if ckpt.ranks.is_main:
            files[STATE_FILE] = value
        return files, None

    def step(self, step: int, state: Any | Callable[[], Any], rank_state: object = None) -> None:
        """The step boundary after `step` finished steps, on every rank. `state`, or a function
        returning it (called only when a save is due), is what restore() gives back; `rank_state`
        this rank's own part, restored as `rank_state`."""
        self._clock.arrived()
        ckpt, stop = self._made()
        if self._pace is None and (dist := distributed.current()) is not None:  # the group slurmkit brought up
            self._pace = straggler.sharing(dist, os.environ.get("SLURMKIT_RUN_DIR"))
        agreed = stop.agree(ckpt.ranks)
        ckpt.at_boundary(agreed.writing)
        if agreed.stop:
            self.save(step, state, wait=True, rank_state=rank_state)  # committed on every rank before any leaves
            stop.stop(step, agreed.stop)
            self.script.end(step, agreed.stop)
        if self.every and step % self.every == 0:
            self.save(step, state, rank_state=rank_state)
        elif self.every and not callable(state):  # its host memory, before the first save needs it
            ckpt.reserve(lambda: self._files(state, rank_state))
        self.script.stepped()
        self._clock.left()

    def close(self) -> None:
        """Commit a save still in flight (the function returned); stop sharing the rank's pace."""
        if self._pace is not None:
            self._pace.stop()
        if self._parts is not None:
            self._ckpt.finish()


def _rank_file(rank: int) -> str:
    return f"rank{rank}.pt"


def _run_folder_uri() -> str:
    """The run's checkpoint URI, as `task: train` finds it."""
    uri = checkpoint_uri(os.environ.get("SLURMKIT_RUN_DIR"))
    if not uri:
        raise RuntimeError("slurmkit.Checkpoint outside a slurmkit run needs uri=")
    return uri


_default: Checkpoint | None = None


def default() -> Checkpoint:
    """The Checkpoint of this process, made on first use."""
    global _default
    if _default is None:
        _default = Checkpoint()
    return _default


def finish() -> None:
    """Commit the default Checkpoint's save still in flight, if it was ever made (the run's entry,
    once the function returns)."""
    if _default is not None:
        _default.close()


def restore() -> Any | None:
    return default().restore()


def step(n: int, state: Any | Callable[[], Any], rank_state: object = None) -> None:
    default().step(n, state, rank_state)


def save(n: int, state: object, wait: bool = False) -> None:
    default().save(n, state, wait)


def wants_checkpoint(fn: Callable[..., Any]) -> str | None:
    """The parameter of fn annotated slurmkit.Checkpoint, if any. A string annotation is evaluated
    in fn's module, so a user's own class named Checkpoint is not taken for it; one that cannot
    be evaluated there (imported inside a function) counts when it reads Checkpoint or
    slurmkit.Checkpoint."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    for p in params:
        ann = p.annotation
        if isinstance(ann, str):
            try:
                ann = eval(ann, getattr(fn, "__globals__", {}))  # noqa: S307 - the function's own annotation
            except Exception:  # noqa: BLE001 - not resolvable in its module: judge by the text
                ann = Checkpoint if ann in ("Checkpoint", "slurmkit.Checkpoint") else None
        if ann is Checkpoint:
            return p.name
    return None
