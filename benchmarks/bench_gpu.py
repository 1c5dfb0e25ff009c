"""The GPT example on one GPU: NCCL, bf16 autocast, DDP and FSDP2, compiled and eager; its MFU and its
async-save stall.

Each figure against a baseline measured in the same run:
1. MFU, as the Trainer reports it (achieved FLOP/s over the device's bf16 datasheet peak, `flops.py`),
   and the same throughput over a bf16 8192^3 matrix product measured here first (the ceiling this
   chip reaches on one plain kernel).
2. The async-save stall under FSDP: the training thread's time in slurmkit's saves as a share of its
   step time, against DCP's own `async_save` in the same loop on the same rank (bench_sharded's
   `stall_rank`); and both again under DDP.

Each of DDP and FSDP2 runs eager and with `config.compile` (per block, inductor), the fast paths on
(fused AdamW; FSDP2's bf16 parameters with fp32 reductions, its forward prefetch). Needs CUDA; one
rank (NCCL refuses two ranks on one device).

    python -P benchmarks/bench_gpu.py [--steps 300] [--every 100] [--layers 12] [--d-model 1024] [--seq 1024]
        [--batch 16] [--vocab 32000] [--compile both|on|off] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sharded import free_port, stall_rank  # noqa: E402


def matmul_tflops(n: int = 8192, repeat: int = 10, device: str = "cuda") -> float:
    """bf16 n^3 product on random data (fp32 on CPU): mean of `repeat` after 3 warm-ups, in TFLOP/s."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(repeat):
        a @ b
    sync()
    return 2 * n**3 * repeat / (time.perf_counter() - t0) / 1e12


def run(parallel: str, gpt: dict[str, Any], every: int, root: Path) -> tuple[float, float, dict[str, Any],
                                                                         dict[str, list[float]]]:
    """Both stalls as shares of step time, slurmkit's summary, and each save's stall (ours, dcp)."""
    out = root / f"stall-{parallel}"
    mp.spawn(stall_rank, args=(1, free_port(), str(root / parallel), {**gpt, "parallel": parallel}, every, str(out)),
             nprocs=1)
    head, saves, summary = out.read_text().splitlines()
    ours, dcps = map(float, head.split()[:2])
    return ours, dcps, json.loads(summary), json.loads(saves)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--compile", default="both", choices=["both", "on", "off"])
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--cpu", action="store_true", help="the same runs on this CPU, fp32 (checks the script)")
    args = parser.parse_args()
    if not (args.cpu or torch.cuda.is_available()):
        sys.exit("bench_gpu: no CUDA device here (--cpu runs it on this CPU)")
    if args.cpu:
        ceiling = matmul_tflops(1024, device="cpu")
        print(f"CPU: fp32 1024^3 matmul {ceiling:.3f} TFLOP/s (this run's ceiling)", flush=True)
    else:
        ceiling = matmul_tflops()
        print(f"{torch.cuda.get_device_name()}: bf16 8192^3 matmul {ceiling:.0f} TFLOP/s (this run's ceiling)",
              flush=True)
    gpt = {"model": "gpt", "dtype": "float32" if args.cpu else "bfloat16", "steps": args.steps,
           "batch_size": args.batch, "n_layer": args.layers,
           "d_model": args.d_model, "n_head": args.heads, "seq_len": args.seq, "vocab_size": args.vocab,
           "dataset_size": args.batch * 64, "log_every": 50, "seed": 0, "gpu_sample_s": 0}
    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="bench-gpu-"))
    try:
        compiled = {"both": (False, True), "on": (True,), "off": (False,)}[args.compile]
        for parallel, compile_ in ((p, c) for p in ("ddp", "fsdp") for c in compiled):
            fast = {"compile": compile_, "fused_optimizer": True, "fsdp_forward_prefetch": True}
            ours, dcps, s, saves = run(parallel, {**gpt, **fast}, args.every, root)
            parallel = f"{parallel} {'compiled' if compile_ else 'eager'}"
            print(f"{parallel}: compile {s.get('compile_s', 0.0):.1f} s", flush=True)
            achieved = s["mfu"] * s["peak_flops"] / 1e12
            print(f"{parallel}: backend {s['backend']}, {s['tokens_per_s']:,.0f} tokens/s, median step "
                  f"{s['median_step_s'] * 1e3:.1f} ms, MFU {s['mfu']:.1%} of {s['peak_flops'] / 1e12:.3g} TFLOP/s "
                  f"({s['peak_source']}); {achieved:.3g} TFLOP/s = {achieved / ceiling:.2f}x the matmul ceiling",
                  flush=True)
            print(f"{parallel}: async save every {args.every} of {args.steps} steps: slurmkit stall {ours:.2%} of "
                  f"step time; DCP's async_save in the same loop {dcps:.2%} (goal <= 2%)", flush=True)
            steady = sum(saves["ours"][1:]) / (s["median_step_s"] * s["steps"])
            print(f"{parallel}: each save's stall (s): slurmkit {saves['ours']}, DCP {saves['dcp']}; slurmkit's "
                  f"after its first save {steady:.2%} of step time", flush=True)
            shutil.rmtree(root / parallel.split()[0], ignore_errors=True)  # ~2.6 GB a save at the default size
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
