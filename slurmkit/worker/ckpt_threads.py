"""The background side of checkpoints: the host copy a save is taken into (cpu_copy), the writer
thread that writes it (AsyncWriter), and the search for the newest valid step at start-up (Prefetch)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from slurmkit.worker.ckptstore import CheckpointError, CheckpointStore, Entry


def cpu_copy(obj: Any, buffers: dict[str, Any] | None = None) -> Any:
    """A CPU copy of a (nested) state, taken at a step boundary so training may go on.

    With `buffers`, tensors are copied into the memory of an earlier copy taken with the same
    buffers when shapes match: fresh allocations (page faults) cost more than the copy itself. The
    caller keeps a set of buffers out of use while its copy is being written or kept.

    A plain CUDA tensor is copied into pinned host memory without blocking, and the copies are
    waited for once, at the end: pageable copies run at a fraction of the link's speed, and each
    one would wait for the GPU on its own. A DTensor (FSDP's shards) takes the plain copy, into a
    DTensor with a host shard: DTensor.from_local would move a pinned shard back onto the GPU.
    """
    from_gpu: list[bool] = []
    copy = _copy(obj, buffers, "", from_gpu)
    if from_gpu:
        import torch

        torch.cuda.synchronize()
    return copy


def _copy(obj: Any, buffers: dict[str, Any] | None, key: str, from_gpu: list[bool]) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        src = obj.detach()
        # pinning no bytes fails (an empty tensor, or a shard of one smaller than the ranks)
        pinned = src.is_cuda and type(src) is torch.Tensor and src.numel() > 0
        from_gpu += [True] if pinned else []
        old = buffers.get(key) if buffers is not None else None
        if old is not None and old.shape == src.shape and old.dtype == src.dtype:
            return old.copy_(src, non_blocking=pinned)
        if pinned:
            copy = torch.empty(src.shape, dtype=src.dtype, pin_memory=True).copy_(src, non_blocking=True)
        else:
            copy = src.to("cpu", copy=True)
        if buffers is not None:
            buffers[key] = copy
        return copy
    if isinstance(obj, dict):
        return {k: _copy(v, buffers, f"{key}/{k}", from_gpu) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_copy(v, buffers, f"{key}/{i}", from_gpu) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    return obj


class Prefetch:
    """latest_valid() run in a thread while the process does other start-up work.

    File reads and checksums release the GIL, so on a restart this overlaps with torch.distributed's
    rendezvous and building the model; the verified bytes are then loaded without a second read.
    """

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.messages: list[str] = []
        self._data: dict[str, bytes] = {}
        self._step: int | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="slurmkit-ckpt-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._step = self.store.latest_valid(self.messages.append, self._data)
        except BaseException as exc:  # raised by result(), in the thread that asks
            self._error = exc

    def result(self) -> tuple[int | None, dict[str, bytes]]:
        """The newest valid step (None: none) and its verified file bytes, by name."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._step, self._data


class AsyncWriter:
    """This rank's share of a save, written in a background thread; at most one save in flight.

    A failure in the background is kept and raised by the next call to `result()`, `wait()` or
    `start()`, so it is never silently lost.
    """

    def __init__(self, store: CheckpointStore, on_file: Callable[[int, str], None] | None = None) -> None:
        """`on_file(step, name)` runs in the writer thread after each file is written (fault injection)."""
        self.store = store
        self.on_file = on_file
        self._thread: threading.Thread | None = None
        self._entries: list[Entry] = []
        self._error: BaseException | None = None
        self.step: int | None = None

    @property
    def pending(self) -> bool:
        return self.step is not None

    @property
    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def start(self, step: int, files: dict[str, Any], before: Callable[[], list[Entry]] | None = None) -> None:
        """Write `files` (one per name) in the background; `before`, a writer of its own (a sharded
        save: slurmkit.worker.sharded), runs first in the same thread, and its entries count too."""
        self.wait()
        self.step, self._entries, self._error = step, [], None

        def work() -> None:
            try:
                if before is not None:
                    self._entries.extend(before())
                for name, obj in files.items():
                    self._entries.append(self.store.write_obj(step, name, obj))
                    if self.on_file is not None:
                        self.on_file(step, name)
            except BaseException as exc:  # kept, and raised in the training thread
                self._error = exc

        self._thread = threading.Thread(target=work, name=f"slurmkit-ckpt-{step}", daemon=True)
        self._thread.start()

    def wait(self, heartbeat: Callable[[], None] | None = None) -> None:
        """Join the writer; `heartbeat` is called every second meanwhile (a save is progress)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(1.0)
            if heartbeat is not None:
                heartbeat()

    def abandon(self) -> None:
        """Drop the save in flight, uncommitted (its folder has no marker: never read), once its
        thread is done with the copy; an error it had is dropped with it."""
        self.wait()
        self.step, self._error = None, None

    def result(self, heartbeat: Callable[[], None] | None = None) -> list[Entry]:
        """This rank's entries of the finished save (raising its background error, if any)."""
        self.wait(heartbeat)
        error, self._error = self._error, None
        if error is not None:
            self.step = None
            if isinstance(error, CheckpointError):
                raise error
            raise CheckpointError(f"checkpoint write failed: {error}") from error
        entries = list(self._entries)
        self.step = None
        return entries
