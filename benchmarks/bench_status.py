"""`status` over 1,000 array tasks: calls and seconds, as a ratio to one raw squeue call."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile, RunRecord
from slurmkit.runs import jobs
from slurmkit.slurm import commands

N = 1000


def main() -> None:
    out = subprocess.run(["sbatch", "--parsable", f"--array=0-{N - 1}", "--output=/dev/null", "--wrap", "sleep 60"],
                         capture_output=True, text=True, check=True).stdout
    array_id = out.strip().split(";")[0]
    try:
        root = Path(tempfile.mkdtemp(prefix="bench-status-"))
        for i in range(N):
            paths = RunPaths(root / f"task-{i:04d}")
            RunFile(paths).create(RunRecord(run_id=paths.run_id, run_dir=str(paths.run_dir), executor="slurm",
                                            job_ids=[f"{array_id}_{i}"], num_tasks=1))
        t0 = time.perf_counter()
        subprocess.run(["squeue", "--me", "--array", "--noheader"], capture_output=True, check=True)
        baseline = time.perf_counter() - t0
        t0 = time.perf_counter()
        with commands.counting() as tools:
            rows = jobs.status(str(root))
        took = time.perf_counter() - t0
        print(json.dumps({
            "tasks": len(rows), "squeue_calls": tools["squeue"], "sacct_calls": tools["sacct"],
            "status_s": round(took, 3), "raw_squeue_s": round(baseline, 3),
            "ratio_vs_raw_squeue": round(took / baseline, 2), "goal": "1 squeue + <=1 sacct, <=0.3 s",
        }))
    finally:
        subprocess.run(["scancel", array_id], check=False)


if __name__ == "__main__":
    main()
