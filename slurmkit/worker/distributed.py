"""torch.distributed for functions submitted from Python: the same initialisation as `task: train`.

    def fn():
        rank, world_size, device = slurmkit.distributed.init()
        ...  # all-reduce freely

init() brings up the process group from the Slurm environment (or submitit's local one): NCCL on
GPUs, gloo on CPU, MASTER_ADDR from the job's first node, a port owned by slurmkit.common.ports.
The run's entry tears it down when the function returns. Torch is imported on the first call.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from slurmkit.worker.process_group import distributed

_active: AbstractContextManager[Any] | None = None
_dist: Any = None


def init(timeout_s: float | None = None) -> tuple[int, int, Any]:
    """(rank, world_size, torch.device); a second call returns the same."""
    global _active, _dist
    import torch

    if _dist is None:
        ctx = distributed(timeout_s)
        _dist = ctx.__enter__()
        _active = ctx
    return _dist.rank, _dist.world_size, torch.device(_dist.device_str)


def current() -> Any:
    """The process group init() brought up (a process_group.Dist), or None."""
    return _dist


def shutdown() -> None:
    """Leave the process group together (a barrier) and destroy it; nothing if init() was not called."""
    global _active, _dist
    ctx, _active, _dist = _active, None, None
    if ctx is not None:
        ctx.__exit__(None, None, None)


def abandon() -> None:
    """Destroy the process group without waiting for the other ranks (the function raised)."""
    global _active, _dist
    ctx, _active, _dist = _active, None, None
    if ctx is not None:
        error = RuntimeError("the function raised")
        ctx.__exit__(type(error), error, None)
