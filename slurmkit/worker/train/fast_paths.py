"""The Trainer's fast paths, each a TrainConfig field with its default (docs/training.md): compile
per block, activation checkpointing per block, FSDP2's mixed precision, reshard and prefetch, and
where a run's compiled code is cached.

Applied in torchtitan's order, before the optimizer is made: activation checkpointing, then
compile, then FSDP2's shards (each block, then the root). Both of the first two replace a block's
`forward` in place, so its state_dict keys stay those of the plain module: a checkpoint saved with
compile on resumes with it off, and the other way round.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

from slurmkit import trust
from slurmkit.common.layout import RunPaths


@dataclass(frozen=True)
class FastPaths:
    compile: bool = False
    activation_checkpointing: bool = False
    fsdp_param_dtype: torch.dtype | None = None
    """FSDP2's parameter dtype in forward and backward (reductions stay fp32); None: as stored."""
    reshard_after_forward: bool = True
    forward_prefetch: bool = False

    @classmethod
    def of(cls, cfg: Any, compute_dtype: torch.dtype | None) -> FastPaths:
        """From a TrainConfig and the run's compute dtype (fsdp_mixed_precision auto follows it)."""
        mp = cfg.fsdp_mixed_precision
        bf16 = mp == "bf16" or (mp == "auto" and compute_dtype == torch.bfloat16)
        return cls(cfg.compile, cfg.activation_checkpointing, torch.bfloat16 if bf16 else None,
                   cfg.fsdp_reshard_after_forward, cfg.fsdp_forward_prefetch)


def blocks(model: nn.Module) -> list[nn.Module]:
    """A model's repeated blocks (`blocks` or `layers`, as GPT-style models name them): the units
    FSDP2 shards one at a time, and compile and recompute one at a time; none for other models."""
    for name in ("blocks", "layers"):
        found = getattr(model, name, None)
        if isinstance(found, (nn.ModuleList, nn.Sequential)):
            return list(found)
    return []


def _recomputed(module: nn.Module) -> None:
    forward = module.forward

    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = run


def _compiled(module: nn.Module) -> None:
    # The forward only, not the module's call: FSDP2's and DDP's hooks stay around it, eager.
    module.forward = torch.compile(module.forward)


def apply(model: nn.Module, parallel: str, fast: FastPaths) -> nn.Module:
    """The fast paths on `model` (already on its device), in place; FSDP2's shards under fsdp."""
    units = blocks(model)
    for unit in units or [model]:
        if fast.activation_checkpointing:
            _recomputed(unit)
        if fast.compile:
            _compiled(unit)
    if parallel == "fsdp":
        policy = MixedPrecisionPolicy(param_dtype=fast.fsdp_param_dtype, reduce_dtype=torch.float32) \
            if fast.fsdp_param_dtype is not None else MixedPrecisionPolicy()
        for unit in units:
            fully_shard(unit, mp_policy=policy, reshard_after_forward=fast.reshard_after_forward)
        fully_shard(model, mp_policy=policy)
        if fast.forward_prefetch:
            for this, after in zip(units, units[1:], strict=False):
                this.set_modules_to_forward_prefetch([after])  # type: ignore[operator]
    return model


def cache_folder(paths: RunPaths, where: str, run_id: str) -> Path:
    """The run's compile cache: in its folder (where "run"), or on this node (where "node") under
    $TMPDIR/slurmkit-UID/, made private and checked as the caller's first (a name in /tmp that
    another user made first would otherwise hold our code)."""
    if where == "run":
        return paths.compile_cache
    base = Path(os.environ.get("TMPDIR") or "/tmp") / f"slurmkit-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    trust.check(trust.reason(base), str(base), "valid: a folder of your own that no one else can write")
    return base / run_id.replace("/", "-") / "compile-cache"


def compile_cache(folder: Path) -> Path:
    """Inductor's caches (its FX graphs, autotuning, Triton kernels) in `folder`, made private and
    checked as the caller's when opened: torch's default, /tmp/torchinductor_USER, is a name any
    user of the node could create first and fill with code. Set before the first compile; the next
    incarnation of the run sets the same folder and loads what this one compiled."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    trust.check(trust.reason(folder), str(folder), "valid: a folder of your own that no one else can write")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
    os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "1"
    return folder
