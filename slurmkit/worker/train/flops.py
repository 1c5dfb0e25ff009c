"""FLOP counts and MFU (the metrics file itself: slurmkit.common.metrics).

MFU = achieved FLOP/s / (ranks x peak FLOP/s of one rank's device).
- GPT: 6N + 12·L·H·Q·T FLOPs per token (PaLM appendix B; nanoGPT, torchtitan): N non-embedding
  parameters, L layers, H heads, Q head dim, T sequence length.
- Dense classifier: 6 FLOPs per weight per sample (2 forward, 4 backward).
- Peak: the bf16 dense table below on GPUs; on CPU an estimate of fp32 FMA throughput,
  CPU_FLOPS_PER_CORE x threads, stated as `peak_source` in every summary. `peak_flops` overrides.
"""

from __future__ import annotations

# Dense bf16 tensor-core peaks from NVIDIA's datasheets (without sparsity), by the name torch gives
# the device, most specific first: "NVIDIA H100 PCIe" and "NVIDIA H100 NVL" before the SXM part
# ("NVIDIA H100 80GB HBM3"), "GH200" before "H200". benchmarks/gpu_check.sh's list, every one.
PEAK_BF16_FLOPS = {
    "H100 PCIE": 756e12, "H100 NVL": 835e12, "H100": 989e12,
    "GH200": 989e12, "H200": 989e12,
    "A100": 312e12, "L40S": 362e12, "B200": 2.25e15,
}
# 2 FMA units x 8 fp32 lanes (AVX2) x 2 FLOPs per FMA x 2.0 GHz: a nominal per-core figure.
CPU_FLOPS_PER_CORE = 64e9


def gpt_flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the weights plus 12·L·H·Q·T for attention scores and values."""
    return 6.0 * n_params + 12.0 * n_layer * n_head * head_dim * seq_len


def dense_flops_per_sample(weight_counts: list[int]) -> float:
    """Training FLOPs per sample of a stack of dense layers: 6 per weight."""
    return 6.0 * sum(weight_counts)


def peak_flops(device_name: str | None, cpu_threads: int, override: float | None = None) -> tuple[float, str]:
    """(peak FLOP/s of one rank, where the figure comes from)."""
    if override:
        return override, "config.peak_flops"
    if device_name:
        for key, value in PEAK_BF16_FLOPS.items():
            if key in device_name.upper():
                return value, f"bf16 table: {key}"
        return PEAK_BF16_FLOPS["A100"], f"unknown GPU {device_name!r}: A100 bf16 assumed"
    source = f"CPU estimate: {CPU_FLOPS_PER_CORE:.3g} FLOP/s per core x {cpu_threads} threads"
    return CPU_FLOPS_PER_CORE * cpu_threads, source


def mfu(flops_per_step: float, step_s: float, world_size: int, peak: float) -> float:
    """Model FLOPs utilisation of one step; flops_per_step counts the whole global batch."""
    if step_s <= 0 or peak <= 0:
        return 0.0
    return flops_per_step / step_s / (world_size * peak)
