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


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: Dataset[Any],
        loss_fn: LossFn,
        dist: Dist,
        *,
        steps: int,
        micro_batch: int,
        grad_accum: int = 1,
        seed: int = 0,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        flops_per_sample: float = 0.0,
        tokens_per_sample: int = 0,
        peak_flops: float = 0.0,
        metrics: MetricsWriter | None = None,
        log_every: int = 10,
        autocast_dtype: torch.dtype | None = None,
        hooks: list[Hook] | None = None,
    ) -> None:
        self.dist = dist
        self.device = torch.device(dist.device_str)
        self.raw_model = model.to(self.device)
        self.model: nn.Module = self.raw_model
        if dist.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = DistributedDataParallel(self.raw_model, device_ids=ids)
        self.optimizer, self.scheduler, self.loss_fn = optimizer, scheduler, loss_fn
        self.steps, self.micro_batch, self.grad_accum = steps, micro_batch, grad_accum
        self.flops_per_sample, self.tokens_per_sample, self.peak_flops = flops_per_sample, tokens_per_sample, peak_flops
        self.metrics = metrics or MetricsWriter(None, False)
        self.log_every, self.autocast_dtype = log_every, autocast_dtype
        self.hooks = hooks or []
        self.state = TrainState()
        self.stop_requested = False
        self.sampler: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=dist.world_size, rank=dist.rank, shuffle=True, seed=seed, drop_last=True)
        self.loader = DataLoader(dataset, batch_size=micro_batch, sampler=self.sampler, drop_last=True)
        if len(self.loader) == 0:
            raise ValueError(f"dataset of {len(dataset)} (per rank {len(self.sampler)}) "  # type: ignore[arg-type]
                             f"is smaller than one micro-batch of {micro_batch}")

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dist.world_size

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
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def train_step(self, batches: Iterator[Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.model.train()
        total = torch.zeros((), device=self.device)
        for micro in range(self.grad_accum):
            batch = self._to_device(next(batches))
            last = micro == self.grad_accum - 1
            # Gradients are all-reduced once per optimizer step, on the last micro-batch.
            sync: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
            if not last and isinstance(self.model, DistributedDataParallel):
                sync = self.model.no_sync()
            with sync:
                with self._autocast():
                    loss = self.loss_fn(self.model, batch) / self.grad_accum
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
            "tokens_per_s": self.global_batch * self.tokens_per_sample / step_s,
            "mfu": mfu(self.flops_per_sample * self.global_batch, step_s, self.dist.world_size, self.peak_flops),
            "lr": self.optimizer.param_groups[0]["lr"],
        }
        return record

    def fit(self) -> dict[str, Any]:
        batches = self._batches()
        while self.state.step < self.steps and not self.stop_requested:
            record = self.train_step(batches)
            self.state.history.append({k: record[k] for k in ("step", "loss", "step_s")})
            if self.dist.is_main and (record["step"] % self.log_every == 0 or record["step"] == self.steps):
                print(f"step {record['step']}/{self.steps} loss {record['loss']:.4f} "
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
            "tokens_per_s": self.global_batch * self.tokens_per_sample / step_s if step_s else 0.0,
            "mfu": mfu(self.flops_per_sample * self.global_batch, step_s, self.dist.world_size, self.peak_flops),
            "params_sha256": params_sha256(self.raw_model),
        }
