"""Checkpoint, preemption and hang handling around the Trainer's step boundaries.

At every step boundary the ranks agree on two votes (a stop signal seen, and which; a background
save still writing), carried by the step's gradient all-reduce (slurmkit.worker.agreement), so they all
stop at the same step and commit a save only once every rank's files are written. Rank 0 writes the commit marker. The
signal handler itself only sets a flag.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from slurmkit.common.errors import squash
from slurmkit.worker.ckptstore import (
    TRAINER_FILES,
    AsyncWriter,
    CheckpointError,
    CheckpointStore,
    Entry,
    Prefetch,
    snapshot,
)
from slurmkit.worker.dist import Dist, broadcast_json, gather_json
from slurmkit.worker.preempt import Stop, StopFlag
from slurmkit.worker.trainer import Trainer
from slurmkit.worker.watchdog import Watchdog


def rng_state() -> dict[str, Any]:
    np_state: Any = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class HostCopy:
    """The state of a committed step (or the start's), in this rank's memory: a warm restart's source."""

    step: int
    files: dict[str, Any]
    """model.pt, optim.pt, trainer.pt and this rank's rng file, as a save writes them."""
    on_disk: bool
    """A committed checkpoint holds the same (False: the initial state of a fresh start)."""


@dataclass
class Boundary:
    """A step's start, in what its parameters and optimizer do not hold: where a warm restart from
    the live state resumes (Resilience.live_step)."""

    step: int
    meta: dict[str, Any]
    """trainer.pt as a save writes it: the step count, the data position, the scheduler."""
    rng: dict[str, Any]
    buffers: dict[str, torch.Tensor]
    """The model's buffers (a forward may change them: batch-norm statistics)."""


def trainer_meta(trainer: Trainer) -> dict[str, Any]:
    return {**trainer.state.as_dict(),
            "scheduler": trainer.scheduler.state_dict() if trainer.scheduler is not None else None}


def _apply_meta(trainer: Trainer, meta: dict[str, Any], rng: dict[str, Any] | None) -> None:
    if trainer.scheduler is not None and meta.get("scheduler") is not None:
        trainer.scheduler.load_state_dict(meta["scheduler"])
    trainer.state.load(meta)
    if rng is not None:
        set_rng_state(rng)


def _apply(trainer: Trainer, model: dict[str, Any], optim: dict[str, Any], meta: dict[str, Any],
           rng: dict[str, Any] | None) -> None:
    trainer.raw_model.load_state_dict(model)
    trainer.optimizer.load_state_dict(optim)
    _apply_meta(trainer, meta, rng)


def _kept(tensors: Iterable[tuple[str, torch.Tensor]], memory: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies on the tensors' own device, into `memory` where it fits: no host sync, no allocation
    each step (snapshot() copies to the host, for a save)."""
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


class Resilience:
    def __init__(self, dist: Dist, uri: str, every: int, keep_latest_k: int = 3, async_save: bool = True,
                 hang_timeout_s: float | None = None, on_hang: Any = None, prefetch: Prefetch | None = None,
                 kill_in_save_at: int | None = None, slow_stop_save_s: float = 0.0,
                 on_stop: Callable[[int], None] | None = None) -> None:
        """on_stop(step): told the agreed stop step before its final save starts."""
        self.dist = dist
        self.store = CheckpointStore(uri, TRAINER_FILES)
        self.prefetch: Prefetch | None = prefetch or self.store.prefetch()
        self.kill_in_save_at, self.slow_stop_save_s = kill_in_save_at, slow_stop_save_s
        faulty = dist.is_main and bool(kill_in_save_at or slow_stop_save_s)
        self.writer = AsyncWriter(self.store, self._fault_in_save if faulty else None)
        self._stopping = False
        self.on_stop = on_stop
        self.every, self.keep, self.async_save = every, keep_latest_k, async_save
        self.flag = StopFlag().install()
        self.watchdog = Watchdog(hang_timeout_s, on_hang).start()
        self.stall_s = 0.0
        # Two sets of snapshot memory: the host copy's stays untouched while the next save is taken.
        self._buffers: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        self._slot = 0
        self.host_copy = False
        """Every rank keeps the last committed state in memory (set before restore: warm restarts)."""
        self.committed: HostCopy | None = None
        self._in_flight: HostCopy | None = None
        self.boundary: Boundary | None = None
        """The current step's start (with host_copy): what a restart from the live state needs."""
        self._mark_memory: dict[str, torch.Tensor] = {}  # the boundary's buffers, the same memory each step
        self.resumed_step: int | None = None
        self.stopped_at: int | None = None
        self.stop_kind = Stop.NONE  # as agreed by all ranks

    def _fault_in_save(self, step: int, name: str) -> None:
        """Fault injection, on rank 0 after the first file of a save, in a run that did not resume:
        config.inject_kill_in_save_at_step SIGKILLs it there (the step is left without a marker);
        config.inject_slow_stop_save_s makes the stop's save that much slower."""
        if self.resumed_step is not None:
            return
        if step == self.kill_in_save_at:
            print(f"slurmkit: injected SIGKILL during the save of step {step}, after {name}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if self._stopping and self.slow_stop_save_s:
            print(f"slurmkit: injected {self.slow_stop_save_s:g} s delay in the stop's save of step {step}", flush=True)
            time.sleep(self.slow_stop_save_s)
            self._stopping = False  # once per save

    # --------------------------------------------------------------- collectives

    def _gather(self, obj: Any) -> list[Any]:
        """Every rank's JSON value (a tuple comes back a list): nothing from a peer is unpickled."""
        return [obj] if self.dist.world_size == 1 else gather_json(obj, self.dist.device_str)

    def _from_main(self, obj: Any) -> Any:
        return obj if self.dist.world_size == 1 else broadcast_json(obj, self.dist.device_str)

    # --------------------------------------------------------------- restore

    def restore(self, trainer: Trainer) -> int | None:
        """Load the newest valid checkpoint: rank 0 picks it, every rank loads it (verified).

        One that verifies but does not load (unpickling, a shape mismatch) on any rank is
        skipped by all, with one line saying so, for the next older valid one; none left means a
        fresh start from the model's initial state.
        """
        assert self.prefetch is not None, "restore() runs once"
        found, data = self.prefetch.result()
        if self.dist.is_main:
            for message in self.prefetch.messages:
                print(message, flush=True)
        self.prefetch = None
        step = self._from_main(found)
        initial: dict[str, Any] | None = None
        while step is not None:
            if step != found:  # this rank sees storage differently from rank 0: read what rank 0 verified
                data = {}
            initial = initial or snapshot({"model": trainer.raw_model.state_dict(),
                                           "optim": trainer.optimizer.state_dict()})
            try:
                self._load(trainer, step, data)
                error = ""
            except Exception as exc:  # noqa: BLE001 - any load failure means: try an older checkpoint
                error = f"{type(exc).__name__}: {squash(str(exc), 200, tail=False)}"
            errors = [e for e in self._gather(error) if e]
            if not errors:
                self.resumed_step = step
                if self.dist.is_main:
                    print(f"slurmkit: resumed from checkpoint step-{step}", flush=True)
                self._keep_start(trainer, step)
                return step
            older = self.store.latest_valid(below=step) if self.dist.is_main else None
            if self.dist.is_main:
                print(f"slurmkit: checkpoint step-{step} does not load ({errors[0]}); falling back to "
                      f"{f'step-{older}' if older is not None else 'a fresh start'}", flush=True)
            step, found, data = self._from_main(older), None, {}
        if initial is not None:  # a failed load may have changed some tensors already
            trainer.raw_model.load_state_dict(initial["model"])
            trainer.optimizer.load_state_dict(initial["optim"])
        self._keep_start(trainer, None)
        return None

    def _load(self, trainer: Trainer, step: int, data: dict[str, bytes]) -> None:
        """Every file is read first, then applied: an unreadable one changes nothing."""
        def load(name: str) -> Any:
            return self.store.load(step, name, data.pop(name, None))

        rng_file = f"rng-rank{self.dist.rank}.pt"
        has_rng = rng_file in (self.store.manifest(step) or {}).get("files", {})
        model, optim, meta = load("model.pt"), load("optim.pt"), load("trainer.pt")
        _apply(trainer, model, optim, meta, load(rng_file) if has_rng else None)

    def _keep_start(self, trainer: Trainer, step: int | None) -> None:
        """The state training starts from is the first host copy (a fresh start's: not on disk)."""
        if self.host_copy:
            self.committed = HostCopy(step or 0, snapshot(self._state(trainer), self._buffers[self._slot]),
                                      step is not None)
            self._slot ^= 1

    def restore_from_host(self, trainer: Trainer) -> HostCopy:
        """Back to the last committed state from this rank's host copy, reading nothing from storage;
        a save in flight is dropped uncommitted."""
        assert self.committed is not None, "restore() keeps the first host copy"
        self.writer.abandon()
        self._in_flight = None
        files = self.committed.files
        _drop_step(trainer)
        # Copies: load_state_dict keeps CPU tensors as given (and pops keys), so the steps that follow
        # would change the host copy itself.
        _apply(trainer, files["model.pt"], snapshot(files["optim.pt"]), snapshot(files["trainer.pt"]),
               files[f"rng-rank{self.dist.rank}.pt"])
        if self.committed.on_disk:
            self.resumed_step = self.committed.step
        return self.committed

    def mark(self, trainer: Trainer) -> None:
        """At a step's start: what a restart from the live state needs besides weights and optimizer
        (a few KB, and the buffers: far less than a snapshot)."""
        self.boundary = Boundary(trainer.state.step, snapshot(trainer_meta(trainer)), rng_state(),
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
        _apply_meta(trainer, snapshot(b.meta), b.rng)
        for name, buf in trainer.raw_model.named_buffers():
            buf.copy_(b.buffers[name])
        return b.step

    # --------------------------------------------------------------- saving

    def _state(self, trainer: Trainer, whole: bool = True) -> dict[str, Any]:
        """The live state as a save names it (not yet copied); without `whole`, this rank's rng only."""
        state: dict[str, Any] = {f"rng-rank{self.dist.rank}.pt": rng_state()}
        if whole:
            state["model.pt"] = trainer.raw_model.state_dict()
            state["optim.pt"] = trainer.optimizer.state_dict()
            state["trainer.pt"] = trainer_meta(trainer)
        return state

    def _files(self, trainer: Trainer) -> dict[str, Any]:
        """This rank's files of a save. With a host copy every rank snapshots the whole state, kept
        in memory once the save commits; rank 0 alone writes model, optimizer and trainer state."""
        taken = snapshot(self._state(trainer, self.dist.is_main or self.host_copy), self._buffers[self._slot])
        if self.host_copy:
            self._in_flight = HostCopy(trainer.state.step, taken, True)
        rng = f"rng-rank{self.dist.rank}.pt"
        return taken if self.dist.is_main else {rng: taken[rng]}

    def _commit(self) -> None:
        step = self.writer.step
        error = None
        entries: list[Entry] = []
        try:
            entries = self.writer.result(heartbeat=self.watchdog.progress)
        except CheckpointError as exc:
            error = str(exc)
        gathered = self._gather(([e.__dict__ for e in entries], error))
        errors = [err for _, err in gathered if err]  # the same list on every rank
        if not errors:
            commit_error = None
            if self.dist.is_main:
                try:
                    all_entries = [Entry(**e) for rank_entries, _ in gathered for e in rank_entries]
                    assert step is not None
                    self.store.commit(step, all_entries, {"world_size": self.dist.world_size, "time": time.time()})
                    self.store.prune(self.keep, protect=(step, self.resumed_step))
                except (CheckpointError, OSError) as exc:
                    commit_error = str(exc)
            commit_error = self._from_main(commit_error)
            errors = [commit_error] if commit_error else []
        self._in_flight, in_flight = None, self._in_flight
        if errors:
            raise CheckpointError(errors[0])
        if in_flight is not None:  # the committed state is now the host copy; the older one's memory is free
            self.committed = in_flight
            self._slot ^= 1
        if self.dist.is_main:
            print(f"slurmkit: checkpoint step-{step} committed", flush=True)

    def save(self, trainer: Trainer, wait: bool) -> None:
        t0 = time.perf_counter()
        if self.writer.pending:
            self._commit()
        self.writer.start(trainer.state.step, self._files(trainer))
        if wait or not self.async_save:
            self._commit()
        self.stall_s += time.perf_counter() - t0

    # --------------------------------------------------------------- the step boundary

    def attach(self, trainer: Trainer) -> None:
        """Vote at every step boundary and act on the agreement after each step."""
        trainer.votes["stop"] = lambda: int(self.flag.kind)
        trainer.votes["writing"] = lambda: int(self.writer.pending and not self.writer.done)
        trainer.hooks.append(self.on_step_end)
        if self.host_copy:
            trainer.before_step.append(self.mark)

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        stall_before = self.stall_s
        try:
            self._step_end(trainer)
        finally:
            record["ckpt_stall_s"] = self.stall_s - stall_before

    def _step_end(self, trainer: Trainer) -> None:
        self.watchdog.progress(None if self.watchdog.armed else trainer.median_step_s(20))
        stop, writing = trainer.agreed["stop"], trainer.agreed["writing"]
        if self.writer.pending and not writing:
            t0 = time.perf_counter()
            self._commit()
            self.stall_s += time.perf_counter() - t0
        if stop:
            # Every rank stops at this same step and takes part in the final save.
            self._stopping = True
            if self.on_stop is not None:
                self.on_stop(trainer.state.step)
            self.save(trainer, wait=True)
            self.stopped_at = trainer.state.step
            self.stop_kind = Stop(stop)
            trainer.stop_requested = True
        elif self.every and trainer.state.step % self.every == 0:
            self.save(trainer, wait=False)
        self.watchdog.progress()

    def finish(self) -> None:
        """Commit a save still in flight; raise its error if it failed."""
        if self.writer.pending:
            self._commit()
        self.watchdog.stop()
