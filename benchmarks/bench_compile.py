"""config.compile on CPU (inductor, gcc): the GPT example's median step compiled against eager, and a
restart's time to its first step with the run's compile cache against eager's, each in this run.

Every figure comes from a process of its own, as a rank's would (one rank, the train task): eager;
compiled with an empty cache (the run's first incarnation); compiled again in the same run folder
(the next incarnation, which loads the cache). The first step's end is read from the process's
own start-up record (its start, `first_step`, and `compile`), so the restart figure is
process start to the end of the first step. Alternating eager and compiled pairs, medians.

    python -P benchmarks/bench_compile.py [--pairs 2] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import read_records

ROOT = Path(__file__).resolve().parent.parent
GPT = {"model": "gpt", "batch_size": 16, "n_layer": 4, "d_model": 128, "n_head": 4, "seq_len": 64,
       "vocab_size": 256, "dataset_size": 1024, "log_every": 1, "log_min_interval_s": 0, "seed": 0}
TRAIN = ("import json, sys\nfrom slurmkit.worker.train.tasks.train_task import run\n"
         "print(json.dumps(run(json.loads(sys.argv[1]), sys.argv[2])))\n")


def trained(config: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The summary, and the process's first step: its end from the process start, and its compile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMKIT_", "TORCHINDUCTOR"))}
    done = subprocess.run([sys.executable, "-P", "-c", TRAIN, json.dumps(config), str(run_dir)], cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, check=True)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    first = read_records(RunPaths(run_dir).metrics)[0]
    startup = first["startup"]
    summary["first_step_end_s"] = startup["first_step"] + first["step_s"]
    (RunPaths(run_dir).metrics).unlink()  # the next process of this run starts its own file
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-compile-"))
    eager_steps: list[float] = []
    compiled_steps: list[float] = []
    eager_first: list[float] = []
    warm_first: list[float] = []
    cold_first: list[float] = []
    compile_cold: list[float] = []
    compile_warm: list[float] = []
    for k in range(args.pairs):
        cfg = {**GPT, "steps": args.steps}
        eager = trained(cfg, root / f"eager-{k}")
        cold = trained({**cfg, "compile": True}, root / f"compiled-{k}")
        warm = trained({**cfg, "compile": True}, root / f"compiled-{k}")  # the same run's next incarnation
        eager_steps.append(eager["median_step_s"])
        compiled_steps += [cold["median_step_s"], warm["median_step_s"]]
        eager_first.append(eager["first_step_end_s"])
        cold_first.append(cold["first_step_end_s"])
        warm_first.append(warm["first_step_end_s"])
        compile_cold.append(cold["compile_s"])
        compile_warm.append(warm["compile_s"])
        print(json.dumps({"pair": k, "eager_step_ms": round(eager["median_step_s"] * 1e3, 2),
                          "compiled_step_ms": round(warm["median_step_s"] * 1e3, 2),
                          "first_step_end_s": {"eager": eager["first_step_end_s"], "compiled_cold":
                                               cold["first_step_end_s"], "compiled_cache": warm["first_step_end_s"]},
                          "compile_s": {"cold": cold["compile_s"], "cache": warm["compile_s"]}}), flush=True)
    med = statistics.median
    print(json.dumps({
        "median_step_compiled_vs_eager": round(med(compiled_steps) / med(eager_steps), 3), "goal_step": 1.0,
        "restart_first_step_cache_vs_eager": round(med(warm_first) / med(eager_first), 3), "goal_restart": 1.5,
        "first_step_cold_vs_eager": round(med(cold_first) / med(eager_first), 3),
        "compile_s_cold": med(compile_cold), "compile_s_with_cache": med(compile_warm)}))


if __name__ == "__main__":
    main()
