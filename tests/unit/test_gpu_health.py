"""GPU sampling and the node health gate, driven by a stand-in nvidia-smi (no GPU on this machine)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from slurmkit.worker import gpu, health
from tests.conftest import ROOT

STANDINS = ROOT / "tests" / "standins"


@pytest.fixture
def standin_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The stand-in nvidia-smi first on PATH, and NVML out of reach, as on a driver-only node."""
    monkeypatch.setenv("PATH", f"{STANDINS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(gpu, "query_nvml", lambda: None)
    log = tmp_path / "smi.log"
    monkeypatch.setenv("STANDIN_SMI_LOG", str(log))
    return log


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(gpu, "query_nvml", lambda: None)


def test_parse_smi_reads_numbers_and_turns_na_into_none() -> None:
    csv = ("0, NVIDIA H200, 97, 80123, 143771, 689.12, 61, 0\n"
           "1, NVIDIA H200, [N/A], 10, 143771, [Not Supported], 40, [N/A]\n"
           "garbage line\n")
    first, second = gpu.parse_smi(csv)
    assert first == gpu.GpuState(0, "NVIDIA H200", 97.0, 80123.0, 143771.0, 689.12, 61.0, 0)
    assert second.util_pct is None and second.power_w is None and second.ecc_uncorrected is None
    assert second.mem_used_mb == 10.0


def test_stand_in_nvidia_smi_is_queried_with_the_documented_fields(standin_smi: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STANDIN_GPUS", "4")
    gpus, source = gpu.query()
    assert source == "nvidia-smi" and [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[1].util_pct == 13.0 and gpus[3].temp_c == 43.0 and gpus[0].power_w is None
    assert standin_smi.read_text().startswith("--query-gpu=index,name,utilization.gpu,")


def test_without_gpus_sampling_is_absent_and_silent(no_gpu: None, tmp_path: Path) -> None:
    assert gpu.query() == ([], "none")
    sampler = gpu.GpuSampler(tmp_path / "gpu.jsonl", 0.05)
    assert sampler.start() is False
    sampler.stop()
    assert not (tmp_path / "gpu.jsonl").exists()
    assert health.main(["--run-dir", str(tmp_path), "--gpus", "0"]) == 0


def test_sampler_appends_a_line_per_interval(standin_smi: Path, monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.setenv("STANDIN_GPUS", "2")
    sampler = gpu.GpuSampler(tmp_path / "gpu.jsonl", 0.05)
    assert sampler.start() is True
    deadline = time.monotonic() + 10
    while not (tmp_path / "gpu.jsonl").exists() or len((tmp_path / "gpu.jsonl").read_text().splitlines()) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sampler.stop()
    lines = [json.loads(x) for x in (tmp_path / "gpu.jsonl").read_text().splitlines()]
    assert all(ln["kind"] == "gpu" and ln["source"] == "nvidia-smi" and len(ln["gpus"]) == 2 for ln in lines)
    assert lines[0]["gpus"][1]["mem_used_mb"] == 1001.0


def test_health_gate_passes_a_full_node(standin_smi: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STANDIN_GPUS", "8")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-node-3")
    assert health.main(["--run-dir", str(tmp_path), "--gpus", "8"]) == 0
    assert not list(tmp_path.glob("health-*.json"))


@pytest.mark.parametrize("env, reason", [
    ({"STANDIN_GPUS": "7"}, "7 GPUs visible, 8 requested"),
    ({"STANDIN_GPUS": "8", "STANDIN_ECC": "5:2"}, "GPU 5 (NVIDIA H200) has 2 uncorrectable ECC errors"),
    ({"STANDIN_GPUS": "8", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "4 GPUs visible, 8 requested"),
])
def test_health_gate_records_why_a_node_fails(standin_smi: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              env: dict[str, str], reason: str) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-node-3")
    assert health.main(["--run-dir", str(tmp_path), "--gpus", "8"]) == health.EXIT_UNHEALTHY
    record = json.loads((tmp_path / "health-gpu-node-3.json").read_text())
    assert record["node"] == "gpu-node-3" and reason in record["problems"]


def test_visible_gpus_follow_cuda_visible_devices() -> None:
    gpus = [gpu.GpuState(i, "G", None, None, None, None, None, 0) for i in range(4)]
    assert [g.index for g in health.visible(gpus, "1,3")] == [1, 3]
    assert health.visible(gpus, None) == gpus
