"""A 1,000-config sweep (cluster): sbatch calls, slurmkit's own submit time, and `sweep status`.

slurmkit's own time is the submit's wall time minus the time spent inside sbatch, each measured
in this run; `sweep status` is a ratio to one raw squeue call of the same 1,000 tasks.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from submitit.core import utils

from slurmkit.common.sweep_layout import SweepPaths
from slurmkit.slurm import commands
from slurmkit.sweeps import results, spec
from slurmkit.sweeps import submit as sub

N_A, N_B = 100, 10  # 1,000 configs


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    spec_path = tmp / "sweep.yaml"
    spec_path.write_text(yaml.safe_dump({
        "name": "bench", "command": "sleep 600", "resources": {"time": "00:15:00"},
        "sweep": {"grid": {"env.A": [str(i) for i in range(N_A)], "env.B": [str(i) for i in range(N_B)]},
                  "max_parallel": 2}}))
    profile = tmp / "p.yaml"
    profile.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp / "runs")}))

    sbatch_s = 0.0
    original = utils.CommandFunction.__call__

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal sbatch_s
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            sbatch_s += time.perf_counter() - t0

    utils.CommandFunction.__call__ = timed  # type: ignore[method-assign]
    t0 = time.perf_counter()
    with commands.counting() as submit_calls:
        done = sub.submit(spec.load(spec_path), str(profile))
    total = time.perf_counter() - t0
    try:
        paths = SweepPaths(Path(done.sweep_dir))
        time.sleep(2)
        t0 = time.perf_counter()
        subprocess.run(["squeue", "--me", "--array", "--noheader"], capture_output=True, check=True)
        raw = time.perf_counter() - t0
        t0 = time.perf_counter()
        with commands.counting() as status_calls:
            states = results.task_states(paths)
        status_s = time.perf_counter() - t0
        own = total - sbatch_s
        print(json.dumps({
            "tasks": done.tasks, "sbatch_calls": submit_calls["sbatch"],
            "slurm_calls_in_submit": submit_calls.total(), "submit_total_s": round(total, 3),
            "inside_sbatch_s": round(sbatch_s, 3), "slurmkit_own_s": round(own, 3),
            "own_vs_sbatch": round(own / sbatch_s, 2), "goal_own_s": 0.5,
            "status_tasks": len(states), "status_s": round(status_s, 3), "status_calls": dict(status_calls),
            "raw_squeue_s": round(raw, 3), "status_vs_raw_squeue": round(status_s / raw, 2), "goal_status_s": 0.3,
        }))
    finally:
        subprocess.run(["scancel", *done.array_job_ids], check=False)


if __name__ == "__main__":
    main()
