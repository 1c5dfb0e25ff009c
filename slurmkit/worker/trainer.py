"""A small data-parallel Trainer: DDP wrapping, seeded distributed sampling, accumulation, metrics.

Bring a model, an optimizer, a dataset and a loss function; call fit(). Usable from any callable
that runs inside `slurmkit.worker.dist.distributed()`.
"""

from __future__ import annotations

import contextlib
import hashlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from slurmkit.common.metrics import MetricsWriter
from slurmkit.worker.dist import Dist
from slurmkit.worker.metrics import mfu

LossFn = Callable[[nn.Module, Any], torch.Tensor]
Hook = Callable[["Trainer", dict[str, Any]], None]


def params_sha256(model: nn.Module) -> str:
    """Digest of every parameter and buffer, by name: equal digests mean bitwise-equal weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def warmup_cosine(steps: int, warmup_frac: float = 0.05, floor: float = 0.1) -> Callable[[int], float]:
    warmup = max(1, int(steps * warmup_frac))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + torch.cos(torch.tensor(progress * torch.pi)).item())

    return factor


@dataclass
class TrainState:
    """Where training stands; what a checkpoint must carry besides weights and optimizer."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class TrainerOptions:
    """How the Trainer runs: what a built-in task derives from its TrainConfig, or a user passes."""

    steps: int
    """Optimizer steps to run (a resumed run counts from its restored step)."""
    micro_batch: int
    """Samples per rank per forward/backward."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; gradients are all-reduced once, on the last."""
    seed: int = 0
    """Seed of the distributed sampler's shuffle."""
    flops_per_sample: float = 0.0
    """Training FLOPs per sample, for MFU (slurmkit.worker.metrics)."""
    tokens_per_sample: int = 0
    """Tokens per sample, for tokens/s (0: not a token model)."""
    peak_flops: float = 0.0
    """Peak FLOP/s of one rank's device, for MFU."""
    log_every: int = 10
    """Steps between progress lines in the job log."""
    autocast_dtype: torch.dtype | None = None
    """Mixed precision (torch.autocast) dtype, or None for full precision."""


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: Dataset[Any],
        loss_fn: LossFn,
        dist: Dist,
        options: TrainerOptions,
        *,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        metrics: MetricsWriter | None = None,
        hooks: list[Hook] | None = None,
    ) -> None:
        self.dist = dist
        self.options = options
        self.device = torch.device(dist.device_str)
        self.raw_model = model.to(self.device)
        self.model: nn.Module = self.raw_model
        if dist.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = DistributedDataParallel(self.raw_model, device_ids=ids)
        self.optimizer, self.scheduler, self.loss_fn = optimizer, scheduler, loss_fn
        self.metrics = metrics or MetricsWriter(None, False)
        self.hooks = hooks or []
        self.state = TrainState()
        self.stop_requested = False
        self.sampler: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=dist.world_size, rank=dist.rank, shuffle=True, seed=options.seed, drop_last=True)
        self.loader = DataLoader(dataset, batch_size=options.micro_batch, sampler=self.sampler, drop_last=True)
        if len(self.loader) == 0:
            raise ValueError(f"dataset of {len(dataset)} (per rank {len(self.sampler)}) "  # type: ignore[arg-type]
                             f"is smaller than one micro-batch of {options.micro_batch}")

    @property
    def global_batch(self) -> int:
        return self.options.micro_batch * self.options.grad_accum * self.dist.world_size

    def _mfu(self, step_s: float) -> float:
        return mfu(self.options.flops_per_sample * self.global_batch, step_s, self.dist.world_size,
                   self.options.peak_flops)

    def _batches(self) -> Iterator[Any]:
        """Endless batches; the epoch reseeds the shuffle, and the position can be resumed."""
        while True:
            self.sampler.set_epoch(self.state.epoch)
            for i, batch in enumerate(self.loader):
                if i < self.state.batch_in_epoch:
                    continue
                self.state.batch_in_epoch = i + 1
                yield batch
            self.state.epoch += 1
            self.state.batch_in_epoch = 0

    def _to_device(self, batch: Any) -> Any:
        if isinstance(batch, (list, tuple)):
            return type(batch)(self._to_device(b) for b in batch)
        return batch.to(self.device, non_blocking=True) if isinstance(batch, torch.Tensor) else batch

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.options.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.options.autocast_dtype)

    def train_step(self, batches: Iterator[Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.model.train()
        total = torch.zeros((), device=self.device)
        for micro in range(self.options.grad_accum):
            batch = self._to_device(next(batches))
            last = micro == self.options.grad_accum - 1
            # Gradients are all-reduced once per optimizer step, on the last micro-batch.
            sync: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
            if not last and isinstance(self.model, DistributedDataParallel):
                sync = self.model.no_sync()
            with sync:
                with self._autocast():
                    loss = self.loss_fn(self.model, batch) / self.options.grad_accum
                loss.backward()
            total += loss.detach().float()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.dist.world_size > 1:
            tdist.all_reduce(total)
            total /= self.dist.world_size
        loss_value = total.item()  # a sync point, so step_s is the real step time
        step_s = time.perf_counter() - t0
        self.state.step += 1
        record = {
            "step": self.state.step, "loss": loss_value, "step_s": step_s,
            "samples_per_s": self.global_batch / step_s,
            "tokens_per_s": self.global_batch * self.options.tokens_per_sample / step_s,
            "mfu": self._mfu(step_s),
            "lr": self.optimizer.param_groups[0]["lr"],
        }
        return record

    def fit(self) -> dict[str, Any]:
        batches = self._batches()
        while self.state.step < self.options.steps and not self.stop_requested:
            record = self.train_step(batches)
            self.state.history.append({k: record[k] for k in ("step", "loss", "step_s")})
            last = record["step"] == self.options.steps
            if self.dist.is_main and (record["step"] % self.options.log_every == 0 or last):
                print(f"step {record['step']}/{self.options.steps} loss {record['loss']:.4f} "
                      f"{record['samples_per_s']:.1f} samples/s mfu {record['mfu']:.2%}", flush=True)
            try:
                for hook in list(self.hooks):
                    hook(self, record)  # hooks may add fields, e.g. the checkpoint stall of this step
            finally:
                self.metrics.write(record)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        times = [h["step_s"] for h in self.state.history]
        # The first steps pay for warm-up (allocations, DDP buckets); the median ignores them.
        step_s = statistics.median(times[1:] if len(times) > 1 else times) if times else 0.0
        return {
            "steps": self.state.step,
            "loss": self.state.history[-1]["loss"] if self.state.history else None,
            "world_size": self.dist.world_size,
            "backend": self.dist.backend,
            "global_batch": self.global_batch,
            "median_step_s": step_s,
            "samples_per_s": self.global_batch / step_s if step_s else 0.0,
            "tokens_per_s": self.global_batch * self.options.tokens_per_sample / step_s if step_s else 0.0,
            "mfu": self._mfu(step_s),
            "params_sha256": params_sha256(self.raw_model),
        }
