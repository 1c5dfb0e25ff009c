"""On a real CUDA device: staging a GPU state for a checkpoint, the GPU queries, NCCL under the Trainer.

These need a GPU and are skipped without one (the suite's machine has none). They were run on an
H200 with `python -P -m pytest tests/unit/test_gpu_device.py` by benchmarks/gpu_check.sh; the stand-in nvidia-smi tests
(test_gpu_forms.py, test_gpu_health.py) cover the same parsers on every machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from slurmkit.worker import gpu
from slurmkit.worker.checkpoint.threads import cpu_copy, reserve
from slurmkit.worker.train.flops import peak_flops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="NO CUDA DEVICE HERE: these run on a GPU machine (benchmarks/gpu_check.sh)")


def test_a_gpu_state_is_staged_into_pinned_memory_equal_and_reused() -> None:
    state: dict[str, Any] = {"w": torch.randn(1024, 1024, device="cuda"), "step": 3, "cpu": torch.arange(4),
                             "opt": [torch.randn(7, device="cuda").to(torch.bfloat16)]}
    buffers: dict[str, torch.Tensor] = {}
    first = cpu_copy(state, buffers)
    assert first["w"].device.type == "cpu" and first["w"].is_pinned()
    assert torch.equal(first["w"], state["w"].cpu()) and torch.equal(first["opt"][0], state["opt"][0].cpu())
    assert first["step"] == 3 and torch.equal(first["cpu"], state["cpu"])
    ptr = first["w"].data_ptr()
    state["w"].mul_(2)  # the next boundary's values, queued on the GPU behind the copy
    second = cpu_copy(state, buffers)
    assert second["w"].data_ptr() == ptr  # the pinned buffer is reused
    assert torch.equal(second["w"], state["w"].cpu())  # and waited for: no stale or half-copied values


def test_the_gpu_queries_see_the_device_torch_sees() -> None:
    name = torch.cuda.get_device_name()
    smi = gpu.query_smi()
    assert smi, "nvidia-smi found no GPU"
    assert name in smi[0].name or smi[0].name in name
    assert smi[0].mem_total_mb and smi[0].mem_total_mb > 1000
    gpus, source = gpu.query()
    assert source in ("nvml", "nvidia-smi") and len(gpus) == torch.cuda.device_count()


def test_the_peak_table_knows_this_device() -> None:
    _, source = peak_flops(torch.cuda.get_device_name(), 1)
    assert "bf16" in source and not source.startswith("unknown")


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_the_gpt_example_trains_on_nccl_in_bf16(parallel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmkit.worker.train.tasks import train_task

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29500 + os.getpid() % 1000),
                       "SLURMKIT_CHECKPOINT_URI": str(tmp_path / "ckpt")}.items():
        monkeypatch.setenv(key, value)
    summary = train_task.run({"model": "gpt", "parallel": parallel, "steps": 40, "batch_size": 8, "n_layer": 2,
                              "d_model": 256, "seq_len": 128, "checkpoint_every": 20, "gpu_sample_s": 0,
                              "prefetch_checkpoint": False, "log_every": 10})
    assert summary["backend"] == "nccl" and summary["steps"] == 40
    assert summary["loss"] < 5.0  # from ln(256) = 5.5 at the start: it learned
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("step-")) == ["step-20", "step-40"]
    if torch.distributed.is_initialized():  # FSDP's mesh made the default group itself
        assert "cuda:nccl" in str(torch.distributed.get_backend_config())
        torch.distributed.destroy_process_group()


def test_a_sharded_gpu_state_is_staged_as_dtensors_over_pinned_host_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(28500 + os.getpid() % 1000))
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    try:
        model: Any = fully_shard(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 3)).cuda())
        buffers: dict[str, torch.Tensor] = {}
        reserve(get_state_dict(model, [])[0], buffers)  # as the Trainer does after its first step
        first = cpu_copy(get_state_dict(model, [])[0], buffers)
        weight = first["0.weight"]
        assert weight is buffers["/0.weight"]  # the reserved buffer
        assert isinstance(weight, DTensor) and weight.to_local().device.type == "cpu"
        assert weight.to_local().is_pinned()  # the shard's copy ran at the link's speed, without blocking
        with torch.no_grad():
            for param in model.parameters():
                param.add_(1.0)
        second = cpu_copy(get_state_dict(model, [])[0], buffers)
        assert second["0.weight"] is weight  # reused
        now: dict[str, Any] = get_state_dict(model, [])[0]
        for name, value in now.items():
            assert torch.equal(second[name].to_local(), value.to_local().cpu()), name
    finally:
        torch.distributed.destroy_process_group()
