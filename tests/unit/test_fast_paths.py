"""The Trainer's fast paths on CPU (worker.train.fast_paths): compile per block with inductor against eager,
its cache loaded by a restart (one process; and 2 ranks under FSDP2 through the local requeue),
activation checkpointing, FSDP2's mixed precision, the fused
optimizer's and DDP's options reaching the objects they set. GPU figures: benchmarks/gpu_check.sh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn
from typer.testing import CliRunner

import slurmkit
from slurmkit.cli.app import app
from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import read_records
from slurmkit.common.record import RunFile
from slurmkit.config.train import TrainConfig
from slurmkit.worker.process_group import Dist, DistEnv
from slurmkit.worker.train import fast_paths, trainer
from slurmkit.worker.train.fast_paths import FastPaths
from slurmkit.worker.train.tasks import gpt
from tests.conftest import ROOT, wait_until
from tests.unit.test_local_rehearsal import signal_ranks

GPT = {"model": "gpt", "steps": 8, "batch_size": 4, "n_layer": 2, "d_model": 32, "n_head": 2, "seq_len": 16,
       "vocab_size": 64, "dataset_size": 64, "log_every": 1, "log_min_interval_s": 0, "seed": 1}
DIGITS = {"model": "digits", "steps": 8, "batch_size": 32, "log_every": 1, "log_min_interval_s": 0, "seed": 1}
runner = CliRunner()
LOSS_TOLERANCE = 1e-4  # inductor's fused kernels reorder float sums: the losses agree to about 1e-6 here
TRAIN = """
import json, sys
from torch._dynamo.utils import counters
from slurmkit.worker.train.tasks.train_task import run
summary = run(json.loads(sys.argv[1]), sys.argv[2])
print(json.dumps({"compile_s": summary.get("compile_s"), "hits": counters["inductor"]["fxgraph_cache_hit"],
                  "misses": counters["inductor"]["fxgraph_cache_miss"]}))
"""


def trained(config: dict[str, Any], run_dir: Path) -> tuple[list[float], dict[str, Any]]:
    """One training run in a process of its own (a compile's caches and settings are the process's):
    its losses by step, and what the process saw of the compile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMKIT_", "TORCHINDUCTOR"))}
    done = subprocess.run([sys.executable, "-P", "-c", TRAIN, json.dumps(config), str(run_dir)], cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [r["loss"] for r in read_records(RunPaths(run_dir).metrics)]
    return losses, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("config", [GPT, DIGITS], ids=["gpt", "digits"])
def test_compiled_training_follows_eager_and_a_restart_loads_its_compiled_code(tmp_path: Path,
                                                                             config: dict[str, Any]) -> None:
    eager, _ = trained(config, tmp_path / "eager")
    compiled, first = trained({**config, "compile": True}, tmp_path / "compiled")
    assert len(compiled) == len(eager) == config["steps"]
    assert max(abs(a - b) for a, b in zip(compiled, eager, strict=True)) <= LOSS_TOLERANCE
    assert first["compile_s"] > 0 and first["misses"] > 0
    record = read_records(RunPaths(tmp_path / "compiled").metrics)[0]
    assert record["startup"]["compile"] > record["startup"]["first_step"]  # the report's compile span
    cache = RunPaths(tmp_path / "compiled").compile_cache
    assert cache.is_dir() and cache.stat().st_mode & 0o077 == 0
    # The run's next incarnation: a new process, the same run folder, the same cache.
    (tmp_path / "compiled" / "metrics.jsonl").unlink()
    again, restarted = trained({**config, "compile": True}, tmp_path / "compiled")
    assert restarted["hits"] > 0 and restarted["misses"] == 0
    assert again == compiled


def test_the_fast_path_fields_default_to_eager_full_precision_and_map_to_fastpaths() -> None:
    assert FastPaths.of(TrainConfig(), None) == FastPaths()
    assert FastPaths.of(TrainConfig(), torch.bfloat16).fsdp_param_dtype == torch.bfloat16  # auto follows CUDA's bf16
    assert FastPaths.of(TrainConfig(fsdp_mixed_precision="off"), torch.bfloat16).fsdp_param_dtype is None
    assert FastPaths.of(TrainConfig(fsdp_mixed_precision="bf16"), None).fsdp_param_dtype == torch.bfloat16
    on = FastPaths.of(TrainConfig(compile=True, activation_checkpointing=True, fsdp_reshard_after_forward=False,
                                  fsdp_forward_prefetch=True), None)
    assert (on.compile, on.activation_checkpointing, on.reshard_after_forward, on.forward_prefetch) == (
        True, True, False, True)


def tiny_gpt() -> gpt.GPT:
    torch.manual_seed(0)
    return gpt.GPT(TrainConfig(model="gpt", n_layer=2, d_model=32, n_head=2, seq_len=16, vocab_size=64))


def kept_by_forward(net: nn.Module, x: torch.Tensor) -> int:
    """Tensors the forward saved for the backward (then the backward, run)."""
    count = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = gpt.loss_fn(net, (x, x))
    loss.backward()
    return count


def test_activation_checkpointing_keeps_fewer_activations_for_the_same_gradients() -> None:
    plain, recomputed = tiny_gpt(), fast_paths.apply(tiny_gpt(), "ddp", FastPaths(activation_checkpointing=True))
    assert list(plain.state_dict()) == list(recomputed.state_dict())  # a checkpoint reads either way
    x = torch.randint(0, 64, (2, 16))
    # The blocks' own activations are recomputed in the backward, not kept from the forward.
    assert kept_by_forward(recomputed, x) < kept_by_forward(plain, x) / 2
    for (name, a), b in zip(plain.named_parameters(), recomputed.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None and torch.allclose(a.grad, b.grad, atol=1e-6), name


def test_fsdp_bf16_mixed_precision_computes_in_bf16_with_its_prefetch(tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        net = trainer.parallelize(tiny_gpt(), "fsdp", "cpu", FastPaths(fsdp_param_dtype=torch.bfloat16,
                                                                        forward_prefetch=True))
        seen: list[torch.dtype] = []
        first = fast_paths.blocks(net)[0].get_submodule("mlp.0")
        first.register_forward_pre_hook(lambda m, _: seen.append(m.weight.dtype))
        x = torch.randint(0, 64, (2, 16))
        gpt.loss_fn(net, (x, x)).backward()
        assert seen == [torch.bfloat16]
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in net.parameters())
    finally:
        dist.destroy_process_group()


def one_process(world: int) -> Dist:
    """Rank 0 of `world`, as the Trainer sees it, with no process group behind it."""
    return Dist(DistEnv(rank=0, world_size=world, local_rank=0, local_world_size=world, master_addr="",
                        master_port=0, job_id="", launcher="single"), "gloo", "cpu")


def test_the_optimizer_and_ddp_options_reach_what_they_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils.data import TensorDataset

    from slurmkit.worker.train.tasks.train_task import build

    dist_one = one_process(world=1)
    cfg = TrainConfig(steps=2, batch_size=8)
    assert not build(cfg, dist_one, None)[0].optimizer.defaults["fused"]  # unset: not on CPU
    assert build(cfg.model_copy(update={"fused_optimizer": True}), dist_one, None)[0].optimizer.defaults["fused"]

    made: list[dict[str, Any]] = []

    class Recorded(nn.Module):
        def __init__(self, module: nn.Module, **kwargs: Any) -> None:
            super().__init__()
            made.append(kwargs)

    monkeypatch.setattr(trainer, "DistributedDataParallel", Recorded)
    two = one_process(world=2)
    model = nn.Linear(2, 1)
    options = trainer.TrainerOptions(steps=1, micro_batch=2, ddp_static_graph=True, ddp_bucket_mb=4)
    trainer.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), TensorDataset(torch.zeros(8, 2)),
                    lambda m, b: m(b[0]).sum(), two, options)
    assert made == [{"device_ids": None, "bucket_cap_mb": 4, "static_graph": True}]


def submitted_gpt(tmp_path: Path, profile: Path, name: str, **config: Any) -> tuple[RunPaths, str]:
    """The tiny GPT as a local run of 2 ranks under FSDP2."""
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "task": "train", "resources": {"tasks_per_node": 2},
                                    "config": {**GPT, "steps": 40, "parallel": "fsdp", **config}}))
    result = runner.invoke(app, ["submit", str(spec), "-p", str(profile), "--json"])
    assert result.exit_code == 0, result.output
    sub = json.loads(result.stdout)
    return RunPaths(Path(sub["run_dir"])), sub["run_id"]


def test_compiled_fsdp2_of_two_ranks_follows_eager_through_a_restart_that_compiles_nothing(
        tmp_path: Path, local_profile: Path) -> None:
    eager, eager_id = submitted_gpt(tmp_path, local_profile, "eager")
    assert slurmkit.Job.from_id(eager_id, profile=str(local_profile)).wait(timeout=300) == "COMPLETED"
    paths, run_id = submitted_gpt(tmp_path, local_profile, "compiled", compile=True)
    wait_until(lambda: len(read_records(paths.metrics)) >= 10, 300, "step 10", poll_s=0.2)
    signal_ranks(RunFile(paths).read().job_ids[-1])  # the local requeue: new processes, the same run
    assert slurmkit.Job.from_id(run_id, profile=str(local_profile)).wait(timeout=300) == "COMPLETED"
    (restart,) = RunFile(paths).read().restarts
    assert restart.kind == "requeue" and restart.step is not None and restart.step < 40
    records = read_records(paths.metrics)
    assert [r["step"] for r in records] == list(range(1, 41))
    compiled = [r["loss"] for r in records]
    reference = [r["loss"] for r in read_records(eager.metrics)]
    assert max(abs(a - b) for a, b in zip(compiled, reference, strict=True)) <= LOSS_TOLERANCE
    first, again = [r["compile_cache"] for r in records if "startup" in r]
    assert first["misses"] > 0 and again["misses"] == 0 and again["hits"] > 0
