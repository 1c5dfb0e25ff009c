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
written (slurmkit.worker.ckptstore), a save every `every` steps written in the background, the
newest `keep_latest_k` valid steps kept, and the stop: the signal handler only sets a flag; at
the next `step()` every rank agrees (one small all-reduce), the state of that step is saved and
committed, and rank 0 requeues within the profile's budget. The next incarnation's `restore()`
returns that state, so no finished step is lost. Rank 0 writes the state: the ranks of a
data-parallel function hold the same one. Torch is imported on first use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

STATE_FILE = "state.pt"
DEFAULT_EVERY = 100


class AgreedStop(BaseException):  # noqa: N818 - a control-flow signal, like SystemExit
    """Raised by Checkpoint.step on every rank at the agreed step, after the final save; the run's
    entry turns it into the requeue (slurmkit.worker.interrupt)."""

    def __init__(self, requeue: bool, step: int) -> None:
        super().__init__(f"stopped at step {step}")
        self.requeue, self.step = requeue, step


class Checkpoint:
    def __init__(self, uri: str | None = None, every: int = DEFAULT_EVERY, keep_latest_k: int = 3,
                 async_save: bool = True) -> None:
        """uri: an fsspec URI; unset, the run's ($SLURMKIT_CHECKPOINT_URI, else the run folder's)."""
        from slurmkit.worker.ckptstore import AsyncWriter, CheckpointStore
        from slurmkit.worker.preempt import StopFlag

        uri = uri or _run_folder_uri()
        self.uri, self.every, self.keep, self.async_save = uri, every, keep_latest_k, async_save
        self.store = CheckpointStore(uri, (STATE_FILE,))
        self.writer = AsyncWriter(self.store)
        self.flag = StopFlag().install()
        self.resumed_step: int | None = None
        self._buffers: dict[str, Any] = {}

    # ------------------------------------------------------------------ ranks

    @staticmethod
    def _world() -> tuple[int, int]:
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized():
            return tdist.get_rank(), tdist.get_world_size()
        return 0, 1

    def _max(self, values: list[int]) -> list[int]:
        """The largest of each value over the ranks (the values themselves with one rank)."""
        import torch
        import torch.distributed as tdist

        if self._world()[1] == 1:
            return values
        device = "cuda" if tdist.get_backend() == "nccl" else "cpu"
        t = torch.tensor(values, dtype=torch.int64, device=device)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return [int(v) for v in t.tolist()]

    def _from_main(self, obj: Any) -> Any:
        """Rank 0's JSON value (a step or None): nothing from a peer is unpickled."""
        import torch.distributed as tdist

        from slurmkit.worker.dist import broadcast_json

        if self._world()[1] == 1:
            return obj
        return broadcast_json(obj, "cuda" if tdist.get_backend() == "nccl" else "cpu")

    # ------------------------------------------------------------------ restore / save

    def restore(self) -> Any | None:
        """The newest valid state (rank 0 picks the step, every rank loads it), or None: a fresh start."""
        step = self._from_main(self.store.latest_valid() if self._world()[0] == 0 else None)
        if step is None:
            return None
        self.resumed_step = step
        if self._world()[0] == 0:
            print(f"slurmkit: resumed from checkpoint step-{step}", flush=True)
        return self.store.load(step, STATE_FILE)

    def save(self, step: int, state: Any, wait: bool = False) -> None:
        """Save `state` as step-N: in the background (committed at a later boundary), or now with wait."""
        from slurmkit.worker.ckptstore import snapshot

        if self._world()[0] != 0:
            return
        self._commit()
        value = state() if callable(state) else state
        self.writer.start(step, {STATE_FILE: snapshot(value, self._buffers)})
        if wait or not self.async_save:
            self._commit()

    def _commit(self) -> None:
        if not self.writer.pending:
            return
        step = self.writer.step
        entries = self.writer.result()
        assert step is not None
        self.store.commit(step, entries, {"world_size": self._world()[1]})
        self.store.prune(self.keep, protect=(step, self.resumed_step))
        print(f"slurmkit: checkpoint step-{step} committed", flush=True)

    def step(self, step: int, state: Any | Callable[[], Any]) -> None:
        """The step boundary after `step` finished steps, on every rank. `state`, or a function
        returning it (called only when a save is due), is what restore() gives back."""
        stop, writing = self._max([int(self.flag.kind), int(self.writer.pending and not self.writer.done)])
        if self.writer.pending and not writing:
            self._commit()
        if stop:
            from slurmkit.worker.preempt import Stop

            self.save(step, state, wait=True)
            import torch.distributed as tdist

            if self._world()[1] > 1:
                tdist.barrier()  # committed before any rank leaves
            raise AgreedStop(Stop(stop) == Stop.REQUEUE, step)
        if self.every and step % self.every == 0:
            self.save(step, state)

    def close(self) -> None:
        """Commit a save still in flight (the function returned)."""
        self._commit()


def _run_folder_uri() -> str:
    """The run's checkpoint URI, as `task: train` finds it (slurmkit.worker.lifecycle.checkpoint_uri)."""
    from slurmkit.worker.lifecycle import checkpoint_uri

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


def step(n: int, state: Any | Callable[[], Any]) -> None:
    default().step(n, state)


def save(n: int, state: Any, wait: bool = False) -> None:
    default().save(n, state, wait)


def wants_checkpoint(fn: Callable[..., Any]) -> str | None:
    """The parameter of fn annotated slurmkit.Checkpoint, if any. A string annotation is evaluated
    in fn's module, so a user's own class named Checkpoint is not taken for it; one that cannot
    be evaluated there (imported inside a function) counts when it reads Checkpoint or
    slurmkit.Checkpoint."""
    import inspect

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
