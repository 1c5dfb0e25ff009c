"""Restart to the first step with a 256 MB training state, against the bare imports it cannot avoid.

Two ranks (gloo, torchrun-style environment, no Slurm) train a GPT whose model + AdamW state is
about 256 MB and commit a checkpoint; then the same run starts again, resumes and trains two steps.
The restart cost is read from the first step's start-up record: seconds from the process start
until the first step began, plus what that step took beyond a typical one (work deferred to it).
Baseline, same run: two processes at once doing only `import torch, torch._dynamo`, the floor of
any PyTorch restart on this machine. Both settings of `prefetch_checkpoint` are measured, alternating.

Usage: python benchmarks/bench_restart.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# 12 bytes a parameter (weights + AdamW's two moments) x ~22.3 M parameters = ~256 MB.
CONFIG = {"model": "gpt", "d_model": 768, "n_layer": 3, "n_head": 8, "seq_len": 32, "vocab_size": 256,
          "batch_size": 2, "dataset_size": 64, "log_every": 1000, "seed": 1}
TRAIN = ("from slurmkit.worker.train.tasks.train_task import run; import json, sys; "
         "run(json.loads(sys.argv[1]), sys.argv[2])")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_ranks(args: list[str], port: int) -> float:
    """Run `python args...` as ranks 0 and 1 at once; wall seconds until both are done."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, *args], env={
        **os.environ, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise SystemExit(f"rank failed ({p.returncode}): {err[-2000:]}")
    return time.perf_counter() - t0


def restart_once(folder: Path, prefetch: bool) -> dict[str, Any]:
    run_dir = folder / f"run-{prefetch}-{time.time_ns()}"
    first = {**CONFIG, "steps": 2, "checkpoint_every": 2, "prefetch_checkpoint": prefetch}
    two_ranks(["-c", TRAIN, json.dumps(first), str(run_dir)], free_port())
    state_mb = sum(f.stat().st_size for f in (run_dir / "checkpoints").rglob("*.pt")) / 1024**2
    two_ranks(["-c", TRAIN, json.dumps({**first, "steps": 5}), str(run_dir)], free_port())
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    resumed = [r for r in records if r["step"] > 2]
    typical = statistics.median(r["step_s"] for r in resumed[1:])
    start = resumed[0]["startup"]
    return {"state_MB": round(state_mb), "restart_s": start["first_step"] + max(0.0, resumed[0]["step_s"] - typical),
            "phases": start}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-restart-"))
    bare, runs = [], {True: [], False: []}  # type: ignore[var-annotated]
    for _ in range(args.reps):
        bare.append(two_ranks(["-c", "import torch, torch._dynamo"], free_port()))
        for prefetch in (True, False):
            runs[prefetch].append(restart_once(folder, prefetch))
    floor = statistics.median(bare)
    out: dict[str, Any] = {"state_MB": runs[True][0]["state_MB"], "bare_imports_s": round(floor, 2)}
    for prefetch, name in ((True, "prefetch"), (False, "no_prefetch")):
        restart = statistics.median(r["restart_s"] for r in runs[prefetch])
        out[name] = {"restart_to_first_step_s": round(restart, 2), "vs_bare_imports": round(restart / floor, 2),
                     "phases_of_median": min(runs[prefetch], key=lambda r: abs(r["restart_s"] - restart))["phases"]}
    out["goal_s"] = 3.0
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
