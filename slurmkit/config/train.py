"""Configuration of the built-in `train` task, validated on the login node before submission."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from slurmkit.config.fields import Strict


class Faults(Strict):
    """Faults injected on purpose, to try fault tolerance: one object on the job's side
    (slurmkit.worker.train.faults.FaultInjection) acts on all of them."""

    error_at_step: int | None = Field(None, ge=1)
    """Every rank raises an error at this step, after its update: a deterministic application error."""
    transient_error_at_steps: list[PositiveInt] = Field(default_factory=list)
    """The last rank raises an error once in the forward of each of these steps, before the step's
    update (a marker in the run folder makes each fire once per run): a fault a restart recovers from."""
    kill_in_save_at_step: int | None = Field(None, ge=1)
    """Rank 0 SIGKILLs itself mid-way through the checkpoint save of this step (after its first file),
    in an incarnation that did not resume; the step is left without a commit marker."""
    slow_stop_save_s: float = Field(0.0, ge=0)
    """The save at an agreed stop takes this many seconds longer (rank 0's writer waits after its
    first file), in an incarnation that did not resume: a save that outlasts GraceTime."""
    hold_at_step: int | None = Field(None, ge=1)
    """After this step, in an incarnation that did not resume, every rank waits (the watchdog fed)
    until a stop signal arrives, then stops at the next step: a run sure to meet its time limit."""


DEFAULT_LOG_EVERY = 10
DEFAULT_LOG_MIN_INTERVAL_S = 1.0


class TrainConfig(Strict):
    """Every key is settable with --set config.KEY=VALUE."""

    model: Literal["digits", "gpt"] = "digits"
    """digits: an MLP classifier on 8x8 handwriting-like digits drawn in the task; gpt: a small GPT on synthetic
    tokens."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """ddp: every rank holds the whole model (DistributedDataParallel); fsdp: FSDP2 (fully_shard), every
    rank holds a shard of parameters, gradients and optimizer state, and checkpoints are sharded
    (torch.distributed.checkpoint), each rank writing its own and a resume on another number of ranks
    resharding them. fsdp has no warm restart: an exception restarts the ranks' processes."""
    steps: int = Field(300, ge=1)
    """Optimizer steps to train for."""
    batch_size: int = Field(64, ge=1)
    """Global batch per optimizer step, split evenly over ranks and accumulation micro-steps."""
    grad_accum: int = Field(1, ge=1)
    """Micro-steps accumulated per optimizer step (gradients all-reduced once, on the last)."""
    lr: float = Field(3e-3, gt=0)
    """AdamW learning rate (cosine decay to 10% over `steps`, after a 5% warm-up)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    seed: int = 0
    """Seed of model init, data order and dropout; a fixed seed gives bitwise-identical parameters."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a checkpoint every N steps (0: never); used by fault tolerance."""
    keep_latest_k: int = Field(3, ge=1)
    """Committed checkpoints kept; older ones are removed only after a newer one is committed."""
    async_save: bool = True
    """Write checkpoints in the background (a CPU snapshot at the step boundary, one save in flight)."""
    hang_timeout_s: float = Field(0.0, ge=0)
    """Watchdog: exit and requeue after this long without a step; 0 derives it (10 median steps, >= 10 s)."""
    prefetch_checkpoint: bool = True
    """On a restart, find, read and verify the newest checkpoint in a background thread while the
    process group and the model come up (off: read it after them)."""
    warm_restart: bool = True
    """Under Slurm with gloo, an exception that every rank's process survives restarts training in
    the process (the group rebuilt, the last committed state restored from a copy every rank keeps in
    host memory), within the profile's requeue.in_job and requeue.crash (docs/fault-tolerance.md)."""
    faults: Faults = Field(default_factory=Faults)
    """Fault injection, for trying fault tolerance on purpose (config.faults.*; none by default)."""
    log_every: int | None = Field(None, ge=1)
    """Write a metrics record (and a progress line in the job log) every N steps; each record aggregates
    the steps since the previous one (docs/long-runs.md). Unset: every 10 steps, at most one a second."""
    log_min_interval_s: float | None = Field(None, ge=0)
    """At most one metrics record per this many seconds, whatever log_every says (0: no floor). Unset: 1 s
    when log_every is unset too, else none (a log_every you set is kept). The first, last and stopping
    steps always get their record."""
    peak_flops: float | None = Field(None, gt=0)
    """Peak FLOP/s of one rank's device for MFU; unset: the bf16 table on GPUs, an estimate on CPU."""
    hidden: int = Field(128, ge=1)
    """digits: width of the two hidden layers."""
    n_layer: int = Field(2, ge=1)
    """gpt: transformer blocks."""
    n_head: int = Field(4, ge=1)
    """gpt: attention heads."""
    d_model: int = Field(128, ge=8)
    """gpt: embedding width (a multiple of n_head)."""
    seq_len: int = Field(64, ge=2)
    """gpt: tokens per sequence."""
    vocab_size: int = Field(256, ge=2)
    """gpt: vocabulary of the synthetic token stream."""
    dataset_size: int = Field(4096, ge=1)
    """gpt: number of synthetic sequences."""
    gpu_sample_s: float = Field(10.0, ge=0)
    """Sample each node's GPUs (NVML, else nvidia-smi) this often into metrics-gpu-<host>.jsonl; 0: never.
    Nodes without GPUs sample nothing."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype: auto is bf16 autocast on CUDA, float32 on CPU."""
    compile: bool = False
    """torch.compile (inductor) each transformer block in place (`blocks`/`layers`, the units FSDP2
    shards, so its wraps stay whole; a model without them, whole), as torchtitan does. Its compiled
    code is cached in the run (the profile's compile_cache), so a restart does not compile again."""
    fused_optimizer: bool | None = None
    """AdamW's fused kernel (one kernel for every parameter's update); unset: on CUDA, not on CPU."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward instead of keeping them (non-reentrant
    torch.utils.checkpoint per block): less memory for a bigger batch or model, about a third more compute."""
    ddp_static_graph: bool = False
    """DDP's static_graph: the model uses the same parameters every step, so DDP plans its buckets once."""
    ddp_bucket_mb: int = Field(25, ge=1)
    """DDP's gradient bucket size in MB (bucket_cap_mb): fewer, larger all-reduces the larger."""
    fsdp_mixed_precision: Literal["auto", "off", "bf16"] = "auto"
    """FSDP2's MixedPrecisionPolicy: bf16 is bf16 parameters in forward and backward with fp32 gradient
    reductions; auto is bf16 where the compute dtype is (CUDA), else off."""
    fsdp_reshard_after_forward: bool = True
    """FSDP2 frees each block's gathered parameters after its forward and gathers them again in the
    backward (less memory); off keeps them (one all-gather fewer a block)."""
    fsdp_forward_prefetch: bool = False
    """FSDP2 starts the next block's all-gather during this block's forward (explicit prefetch)."""

    @model_validator(mode="after")
    def _shapes(self) -> TrainConfig:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not a multiple of n_head={self.n_head}")
        return self

    @property
    def metrics_cadence(self) -> tuple[int, float]:
        """(a record every N steps, at most one per S seconds) as log_every and log_min_interval_s
        say: a log_every set by hand is kept exactly unless a floor is set too."""
        floor = self.log_min_interval_s
        if floor is None:
            floor = DEFAULT_LOG_MIN_INTERVAL_S if self.log_every is None else 0.0
        return self.log_every or DEFAULT_LOG_EVERY, floor

    def per_rank_batch(self, world_size: int) -> int:
        """Micro-batch of one rank; the global batch must split evenly."""
        per = self.batch_size // (world_size * self.grad_accum)
        if per * world_size * self.grad_accum != self.batch_size or per == 0:
            raise ValueError(f"batch_size={self.batch_size} does not split over {world_size} ranks x "
                             f"grad_accum={self.grad_accum}")
        return per
