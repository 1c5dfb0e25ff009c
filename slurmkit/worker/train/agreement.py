"""What the ranks agree on at every step boundary, without a collective of its own.

Each step the ranks need the step's loss (its mean over ranks) and the largest value of a few votes
(fault tolerance's "a stop signal seen, and which" and "a background save still writing"). Both ride
on DDP's gradient all-reduce: a comm hook appends them to the last gradient bucket of the step, as
a sum of the loss and of one-hot votes, and takes them off again. So a step makes no collective
besides its gradients'. Where they cannot ride (one rank: nothing to agree; a last bucket that is
not fp32/fp64, where a one-hot sum or the loss would lose precision), one small all-reduce after
the step carries them instead.

A vote is 0 to LEVELS - 1. (No `from __future__ import annotations` here: DDP checks the hook's
annotations against the real classes.)
"""

import functools

import torch
import torch.distributed as tdist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

LEVELS = 4
"""Values a vote can take: 0..3 (slurmkit.worker.ft.stop.Stop fits, and so does a yes/no)."""
_EXACT = (torch.float32, torch.float64)


def pack(loss: torch.Tensor, votes: tuple[int, ...]) -> torch.Tensor:
    """[loss, one-hot of each vote], float64, on the loss's device."""
    return torch.cat([loss.detach().reshape(1).double(), _onehot(votes, loss.device)])


@functools.lru_cache(maxsize=64)
def _onehot(votes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Cached: votes rarely change, and building a tensor every step costs more than the rest of pack."""
    onehot = [0.0] * (LEVELS * len(votes))
    for i, value in enumerate(votes):
        onehot[LEVELS * i + value] = 1.0
    return torch.tensor(onehot, dtype=torch.float64, device=device)


def unpack(summed: list[float], names: list[str], world_size: int) -> tuple[float, dict[str, int]]:
    """(mean loss over the ranks, the largest value of each vote) from the summed pack."""
    agreed = {name: max(level for level in range(LEVELS) if summed[1 + LEVELS * i + level] > 0)
              for i, name in enumerate(names)}
    return summed[0] / world_size, agreed


class Agreement:
    """One step's agreement: `offer` the pack before the backward pass of the step's last micro-batch,
    `result` after the optimizer step."""

    def __init__(self, model: object, world_size: int) -> None:
        self.world_size = world_size
        self._offered: torch.Tensor | None = None
        self._summed: torch.Tensor | None = None
        self.rode = 0
        """Steps whose agreement rode on the gradients (the others made a collective of their own)."""
        if isinstance(model, DistributedDataParallel):
            model.register_comm_hook(self, _hook)

    def offer(self, packed: torch.Tensor) -> None:
        self._offered, self._summed = packed, None

    def result(self) -> list[float]:
        """The pack summed over the ranks (read back: the step's sync point)."""
        assert self._offered is not None, "offer() comes first"
        if self.world_size == 1:
            summed = self._offered
        elif self._summed is None:  # it did not ride on the gradients
            summed = self._offered
            tdist.all_reduce(summed)
        else:
            summed = self._summed
            self.rode += 1
        self._offered = self._summed = None
        return [float(v) for v in summed.tolist()]

    def _ride(self, bucket: tdist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        grads = bucket.buffer()
        offered = self._offered
        assert offered is not None
        n = grads.numel()
        grads.div_(self.world_size)  # the mean, divided first as torch's default hook does
        both = torch.cat([grads, offered.to(grads.dtype)])

        def split(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            out = fut.value()[0]
            self._summed = out[n:].double()
            return out[:n]

        return tdist.all_reduce(both, async_op=True).get_future().then(split)


def _hook(state: Agreement, bucket: tdist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: torch's default all-reduce, but the step's last bucket also carries the pack."""
    if bucket.is_last() and state._offered is not None and bucket.buffer().dtype in _EXACT:
        return state._ride(bucket)
    return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]
