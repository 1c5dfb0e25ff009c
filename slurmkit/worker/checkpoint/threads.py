"""The background side of checkpoints: the host copy a save is taken into (cpu_copy), the writer
thread that writes it (AsyncWriter), and the search for the newest valid step at start-up (Prefetch)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from slurmkit.jsontypes import StateDict
from slurmkit.worker import at_exit
from slurmkit.worker.checkpoint.store import CheckpointError, CheckpointStore, Entry


def cpu_copy(obj: Any, buffers: StateDict | None = None) -> Any:
    """A CPU copy of a (nested) state, taken at a step boundary so training may go on.

    With `buffers`, tensors are copied into the memory of an earlier copy (or of reserve()) taken
    with the same buffers when shapes match: fresh allocations (page faults, pinning) cost more than
    the copy itself. The caller keeps a set of buffers out of use while its copy is being written
    or kept.

    A CUDA tensor, plain or a DTensor's shard (FSDP's), is copied into pinned host memory without
    blocking, and the copies are waited for once, at the end: pageable copies run at a fraction of
    the link's speed, and each one would wait for the GPU on its own.
    """
    from_gpu: list[bool] = []

    def leaf(src: Any, old: Any) -> Any:
        dst, local = _local(old), _local(src)
        pinned = local.is_cuda and local.numel() > 0
        from_gpu.extend([True] if pinned else [])
        dst.copy_(local, non_blocking=pinned)
        return old

    copy = _walk(obj, buffers, "", leaf, touch=False)
    if from_gpu:
        import torch

        torch.cuda.synchronize()
    return copy


def reserve(obj: Any, buffers: StateDict) -> None:
    """Allocate the host memory cpu_copy(obj, buffers) will copy into, and touch it, without copying:
    run in a thread ahead of the first save, which then pays for the copy alone. Pinning gigabytes
    takes about as long as a training step does at this size, and the first save would wait for it."""
    _walk(obj, buffers, "", lambda src, old: old, touch=True)


def any_tensor(obj: Any, test: Callable[[Any], bool]) -> bool:
    """test() holds for any tensor in the (nested: dicts, lists, tuples) state."""
    import torch

    if isinstance(obj, torch.Tensor):
        return test(obj)
    if isinstance(obj, dict):
        return any(any_tensor(v, test) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(any_tensor(v, test) for v in obj)
    return False


def on_device(obj: Any) -> bool:
    """Any tensor in the state, or a DTensor's shard, lives off the CPU (on a GPU)."""
    return any_tensor(obj, lambda t: not _local(t).is_cpu)


def _walk(obj: Any, buffers: StateDict | None, key: str, leaf: Callable[[Any, Any], Any], touch: bool) -> Any:
    """`obj` with each tensor replaced by leaf(tensor, its host buffer): the one in `buffers` under
    the tensor's path when it fits, else a new one (kept there)."""
    import torch

    if isinstance(obj, torch.Tensor):
        src = obj.detach()
        old = buffers.get(key) if buffers is not None else None
        if old is None or not _fits(old, src):
            old = _host_buffer(src, touch)
            if buffers is not None:
                buffers[key] = old
        return leaf(src, old)
    if isinstance(obj, dict):
        return {k: _walk(v, buffers, f"{key}/{k}", leaf, touch) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_walk(v, buffers, f"{key}/{i}", leaf, touch) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def _is_dtensor(t: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _local(t: Any) -> Any:
    """The tensor whose bytes are copied: a DTensor's shard on this rank, else the tensor."""
    return t._local_tensor if _is_dtensor(t) else t


def _fits(old: Any, src: Any) -> bool:
    return (_is_dtensor(old) == _is_dtensor(src) and old.shape == src.shape and old.dtype == src.dtype
            and _local(old).shape == _local(src).shape)


def _host_buffer(src: Any, touch: bool) -> Any:
    """Host memory shaped as `src`: pinned for a CUDA tensor; for a CPU one zeroed when `touch`, so
    its page faults are paid here. A DTensor's is a DTensor of the same spec around a host shard,
    as DCP's own staging makes it: DTensor.from_local would move the shard back onto the GPU."""
    import torch

    if _is_dtensor(src):
        from torch.distributed.tensor import DTensor

        return DTensor(_host_buffer(src._local_tensor, touch), src._spec, requires_grad=False)
    if src.is_cuda and src.numel() > 0:  # pinning no bytes fails (a shard of a tensor smaller than the ranks)
        return torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
    return (torch.zeros if touch else torch.empty)(src.shape, dtype=src.dtype)


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
        self._thread = at_exit.daemon(self._run, "slurmkit-ckpt-prefetch")

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

    def start(self, step: int, files: Mapping[str, object], before: Callable[[], list[Entry]] | None = None) -> None:
        """Write `files` (one per name) in the background; `before`, a writer of its own (a sharded
        save: slurmkit.worker.checkpoint.sharded), runs first in the same thread, and its entries count too."""
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

        self._thread = at_exit.daemon(work, f"slurmkit-ckpt-{step}")

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
