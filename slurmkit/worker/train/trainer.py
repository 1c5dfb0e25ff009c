"""A small data-parallel Trainer: DDP or FSDP2, seeded distributed sampling, accumulation, metrics.

Bring a model, an optimizer, a dataset and a loss function; call fit(). Usable from any callable
that runs inside `slurmkit.worker.process_group.distributed()`.
"""

from __future__ import annotations

import contextlib
import hashlib
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from slurmkit.common.metrics import Interval, MetricsWriter
from slurmkit.jsontypes import JsonObject
from slurmkit.worker.ft import straggler
from slurmkit.worker.process_group import Dist
from slurmkit.worker.train import agreement, fast_paths
from slurmkit.worker.train.fast_paths import FastPaths
from slurmkit.worker.train.flops import mfu

LossFn = Callable[[nn.Module, Any], torch.Tensor]
Hook = Callable[["Trainer", JsonObject], None]
_NULL = contextlib.nullcontext()  # reusable: it holds no state


def params_sha256(model: nn.Module) -> str:
    """Digest of every parameter and buffer (0-d ones too: batch norm counts), by name: equal digests
    mean bitwise-equal weights. A sharded (FSDP) model's are gathered whole: every rank calls it."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        digest.update(name.encode())
        digest.update(whole.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


PARALLEL = ("ddp", "fsdp")
"""ddp: every rank holds the whole model, gradients all-reduced; fsdp: FSDP2's fully_shard, every
rank holds a shard of parameters, gradients and optimizer state (checkpoints through DCP)."""


def parallelize(model: nn.Module, parallel: str, device: torch.device | str,
                fast: FastPaths | None = None) -> nn.Module:
    """The model on `device`, its fast paths applied (worker.train.fast_paths: compile, activation
    checkpointing per block) and under fsdp sharded in place with FSDP2 (its blocks, then the root),
    before an optimizer is made over its parameters (fully_shard replaces them with DTensors)."""
    model = model.to(device)
    if isinstance(model, FSDPModule):
        return model
    return fast_paths.apply(model, parallel, fast or FastPaths())


def warmup_cosine(steps: int, warmup_frac: float = 0.05, floor: float = 0.1) -> Callable[[int], float]:
    warmup = max(1, int(steps * warmup_frac))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + torch.cos(torch.tensor(progress * torch.pi)).item())

    return factor


STEP_WINDOW = 100
"""Step times kept for the median (the summary's, the watchdog's): a bounded window, not the history."""


@dataclass
class TrainState:
    """Where training stands; what a checkpoint must carry besides weights and optimizer.

    Its size does not grow with the step count: the per-step history lives in metrics.jsonl only."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_WINDOW))
    """The latest warm steps' seconds (a process's first step pays for warm-up and is left out)."""
    last_loss: float | None = None

    def as_dict(self) -> JsonObject:
        return {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "step_times": list(self.step_times), "last_loss": self.last_loss}

    def load(self, meta: JsonObject) -> None:
        """From a checkpoint's trainer.pt (as_dict's form)."""
        self.step, self.epoch, self.batch_in_epoch = meta["step"], meta["epoch"], meta["batch_in_epoch"]
        self.step_times = deque(meta.get("step_times", [])[-STEP_WINDOW:], maxlen=STEP_WINDOW)
        self.last_loss = meta.get("last_loss")


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
    """Training FLOPs per sample, for MFU (slurmkit.worker.train.flops)."""
    tokens_per_sample: int = 0
    """Tokens per sample, for tokens/s (0: not a token model)."""
    peak_flops: float = 0.0
    """Peak FLOP/s of one rank's device, for MFU."""
    log_every: int = 10
    """Steps between metrics records (and progress lines in the job log)."""
    log_min_interval_s: float = 1.0
    """At most one metrics record per this many seconds (0: every `log_every` steps); records
    aggregate the steps between them (slurmkit.common.metrics)."""
    autocast_dtype: torch.dtype | None = None
    """Mixed precision (torch.autocast) dtype, or None for full precision."""
    parallel: str = "ddp"
    """How the model is spread over the ranks: one of PARALLEL."""
    ddp_static_graph: bool = False
    """DDP's static_graph (the same parameters used every step)."""
    ddp_bucket_mb: int = 25
    """DDP's bucket_cap_mb."""


Vote = Callable[[], int]
"""A rank's local value, 0 to agreement.LEVELS - 1, for the agreement at every step boundary."""


class Trainer:
    """Runs optimizer steps. The step's loss and each vote in `votes` ride on its gradient all-reduce
    (slurmkit.worker.train.agreement): at the step boundary every rank reads the same mean loss and the
    same agreement (the largest value of each vote) in `agreed`, with no collective of their own."""

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
        self.wrap()
        self.optimizer, self.scheduler, self.loss_fn = optimizer, scheduler, loss_fn
        self.metrics = metrics or MetricsWriter(None, False)
        self.hooks = hooks or []
        self.before_step: list[Callable[[Trainer], None]] = []
        """Called at the start of every step, before its first batch is drawn."""
        self.updating = False
        """Inside a step's update (optimizer, scheduler, step count): the live state is neither the
        step's start nor its end."""
        self.votes: dict[str, Vote] = {}
        self.agreed: dict[str, int] = {}
        self.state = TrainState()
        self.stop_requested = False
        self._first_step_s: float | None = None
        self.sampler: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=dist.world_size, rank=dist.rank, shuffle=True, seed=options.seed, drop_last=True)
        # A generator of its own: each new iterator (an epoch, a restart) draws its workers' seed from
        # it, not from the global RNG that the model's dropout reads, so a restart changes no draw.
        self.loader = DataLoader(dataset, batch_size=options.micro_batch, sampler=self.sampler, drop_last=True,
                                 generator=torch.Generator().manual_seed(options.seed))
        if len(self.loader) == 0:
            raise ValueError(f"dataset of {len(dataset)} (per rank {len(self.sampler)}) "  # type: ignore[arg-type]
                             f"is smaller than one micro-batch of {options.micro_batch}")

    @property
    def sharded(self) -> bool:
        """Parameters and optimizer state are DTensor shards (FSDP2): checkpoints go through DCP."""
        return self.options.parallel == "fsdp"

    def wrap(self) -> None:
        """DDP over the current process group, with the agreement riding on its gradients; called
        again after a warm restart rebuilt the group (the old wrapper holds the old one). Under
        fsdp, FSDP2's fully_shard, in place and once (at one rank too: its checkpoints are sharded,
        so a resume on more ranks reshards them); the agreement takes a small all-reduce of its own."""
        if self.options.parallel not in PARALLEL:
            raise ValueError(f"parallel={self.options.parallel!r}; valid: {', '.join(PARALLEL)}")
        if self.sharded:
            if not isinstance(self.raw_model, FSDPModule):  # its optimizer would hold the unsharded parameters
                raise ValueError("parallel='fsdp' needs the model sharded before its optimizer is made: "
                                 "model = slurmkit.worker.train.trainer.parallelize(model, 'fsdp', device) first")
        elif self.dist.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            o = self.options
            self.model = DistributedDataParallel(self.raw_model, device_ids=ids, bucket_cap_mb=o.ddp_bucket_mb,
                                                 static_graph=o.ddp_static_graph)
        self.agreement = agreement.Agreement(self.model, self.dist.world_size)

    def unwrap(self) -> None:
        """Drop the DDP wrapper, which holds the process group: a warm restart aborts the group next
        (and wrap() makes the next wrapper and its agreement)."""
        self.model = self.raw_model

    @property
    def global_batch(self) -> int:
        return self.options.micro_batch * self.options.grad_accum * self.dist.world_size

    def _mfu(self, step_s: float) -> float:
        return mfu(self.options.flops_per_sample * self.global_batch, step_s, self.dist.world_size,
                   self.options.peak_flops)

    def median_step_s(self, last: int = STEP_WINDOW) -> float:
        """The median of the latest warm steps (the first step's time until there is one)."""
        times = list(self.state.step_times)[-last:]
        return statistics.median(times) if times else (self._first_step_s or 0.0)

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

    def _to_device(self, batch: object) -> Any:
        if self.device.type == "cpu":  # a DataLoader's batches are there already: no walk every step
            return batch
        return self._moved(batch)

    def _moved(self, batch: object) -> Any:
        if isinstance(batch, (list, tuple)):
            return type(batch)(self._moved(b) for b in batch)
        return batch.to(self.device, non_blocking=True) if isinstance(batch, torch.Tensor) else batch

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.options.autocast_dtype is None:
            return _NULL
        return torch.autocast(self.device.type, dtype=self.options.autocast_dtype)

    def _offer(self, loss: torch.Tensor) -> None:
        """This rank's part of the step's agreement: its loss and votes, once the loss is known."""
        self.agreement.offer(agreement.pack(loss, tuple(vote() for vote in self.votes.values())))

    def _agreed_loss(self) -> float:
        loss, self.agreed = agreement.unpack(self.agreement.result(), list(self.votes), self.dist.world_size)
        return loss

    def train_step(self, batches: Iterator[Any]) -> JsonObject:
        t0 = time.perf_counter()
        for call in self.before_step:
            call(self)
        if not self.raw_model.training:  # a hook evaluated; train() walks every module, so not every step
            self.model.train()
        accum = self.options.grad_accum
        total: torch.Tensor | None = None
        own = 0.0  # this rank's forward passes and optimizer step: its own work, no collective's wait
        for micro in range(accum):
            batch = self._to_device(next(batches))
            last = micro == accum - 1
            # Gradients are all-reduced once per optimizer step, on the last micro-batch.
            sync = self.model.no_sync() if not last and isinstance(self.model, DistributedDataParallel) else _NULL
            if isinstance(self.model, FSDPModule) and accum > 1:  # FSDP2's no_sync: reduce-scatter on the last
                self.model.set_requires_gradient_sync(last)
            with sync:
                t_forward = time.perf_counter()
                with self._autocast():
                    loss = self.loss_fn(self.model, batch)
                own += time.perf_counter() - t_forward
                if accum > 1:
                    loss = loss / accum
                part = loss.detach().float()
                total = part if total is None else total + part
                if last:
                    self._offer(total)
                loss.backward()
        self.updating = True
        t_update = time.perf_counter()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        straggler.OWN.add(own + time.perf_counter() - t_update)
        loss_value = self._agreed_loss()
        step_s = time.perf_counter() - t0
        self.state.step += 1
        self.state.last_loss = loss_value
        self.updating = False
        if self._first_step_s is None:
            self._first_step_s = step_s
        else:
            self.state.step_times.append(step_s)
        return {"step": self.state.step, "loss": loss_value, "step_s": step_s}

    def fit(self) -> JsonObject:
        batches = self._batches()
        interval = Interval(self.options.log_every, self.options.log_min_interval_s)
        first = True
        while self.state.step < self.options.steps and not self.stop_requested:
            record: JsonObject | None = None
            try:
                record = self.train_step(batches)
                for hook in list(self.hooks):
                    hook(self, record)  # hooks may add fields, e.g. the checkpoint stall of this step
            except BaseException:
                self._log(interval, record, True)  # a failed step or hook: the steps that ran are written
                raise
            self._log(interval, record, first or self.stop_requested or record["step"] == self.options.steps)
            first = False
        return self.summary()

    def _log(self, interval: Interval, record: JsonObject | None, force: bool) -> None:
        """Rank 0 adds the step (None: none ran) to the interval and writes the interval's record when it ends."""
        if not self.dist.is_main:
            return
        if record is None:
            out = interval.flush()
        else:
            extra = {k: v for k, v in record.items() if k not in ("step", "loss", "step_s")}
            out = interval.add(record["step"], record["step_s"], record["loss"], extra, force)
        if out is None:
            return
        busy = out["step_s_sum"]
        samples = self.global_batch * out["steps"]
        tokens = samples * self.options.tokens_per_sample
        out.update(samples=samples, tokens=tokens, samples_per_s=samples / busy if busy else 0.0,
                   tokens_per_s=tokens / busy if busy else 0.0,
                   mfu=self._mfu(busy / out["steps"]), lr=self.optimizer.param_groups[0]["lr"])
        self.metrics.write(out)
        print(f"step {out['step']}/{self.options.steps} loss {out['loss']:.4f} "
              f"{out['samples_per_s']:.1f} samples/s mfu {out['mfu']:.2%}", flush=True)

    def summary(self) -> JsonObject:
        # The first step of a process pays for warm-up (allocations, DDP buckets): the median leaves it out.
        step_s = self.median_step_s()
        return {
            "steps": self.state.step,
            "loss": self.state.last_loss,
            "world_size": self.dist.world_size,
            "backend": self.dist.backend,
            "global_batch": self.global_batch,
            "median_step_s": step_s,
            "samples_per_s": self.global_batch / step_s if step_s else 0.0,
            "tokens_per_s": self.global_batch * self.options.tokens_per_sample / step_s if step_s else 0.0,
            "mfu": self._mfu(step_s),
            "params_sha256": params_sha256(self.raw_model),
        }
