"""The Python API's submit overhead against submitit's, for the same function on the same cluster,
in the same run: `Executor.submit(fn)` vs `AutoExecutor.submit(fn)`, and `map_array` of 1,000
items vs submitit's `map_array` (each one sbatch of a 1,000-task array), submitit's 0.2 s
throttle between submits turned off. The jobs are held
(`--hold`) and cancelled: what is timed is the login side, not the queue.

    python benchmarks/bench_api.py          # on the dev cluster (root; it is purged at the end)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import submitit
import yaml

import slurmkit
from slurmkit.devcluster import cluster as dc

REPS = 5
ITEMS = 1000


def work(x: int) -> int:
    return x + 1


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-api-"))
    (tmp / "p.yaml").write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp / "runs"),
                                                "sbatch_extra": ["--hold"]}))
    ours = slurmkit.Executor(profile=str(tmp / "p.yaml"), name="bench", time="00:05:00")
    theirs = submitit.AutoExecutor(folder=tmp / "submitit", cluster="slurm")
    theirs.update_parameters(timeout_min=5, slurm_partition="debug", slurm_additional_parameters={"hold": True},
                             slurm_mem="1000M", name="bench")
    # submitit sleeps 0.2 s between two submits of one executor (core.Executor._throttling); the
    # figure compared is without that sleep, so what differs is the work, not a courtesy delay.
    theirs._executor._throttling = 0.0  # type: ignore[attr-defined]
    ids: list[str] = []
    ours_s, theirs_s = [], []
    try:
        for _ in range(REPS):  # alternated, so drift on a noisy machine hits both alike
            t0 = time.perf_counter()
            ids.append(ours.submit(work, 1).job_id)
            ours_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ids.append(str(theirs.submit(work, 1).job_id))
            theirs_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        mapped = ours.map_array(work, range(ITEMS))
        ours_map = time.perf_counter() - t0
        ids.append(mapped[0].job_id.split("_")[0])
        t0 = time.perf_counter()
        their_jobs = theirs.map_array(work, range(ITEMS))
        theirs_map = time.perf_counter() - t0
        ids.append(str(their_jobs[0].job_id).split("_")[0])
        assert len(mapped) == len(their_jobs) == ITEMS
        a, b = statistics.median(ours_s), statistics.median(theirs_s)
        print(json.dumps({"reps": REPS, "submit_s": round(a, 3), "submitit_submit_s": round(b, 3),
                          "submit_ratio_vs_submitit": round(a / b, 2), "map_items": ITEMS,
                          "map_array_s": round(ours_map, 3), "submitit_map_array_s": round(theirs_map, 3),
                          "map_array_ratio_vs_submitit": round(ours_map / theirs_map, 2)}))
    finally:
        subprocess.run(["scancel", *ids], check=False)
        # 2,000 cancelled array tasks count against MaxJobCount for MinJobAge (300 s): leave a clean cluster.
        dc.up(2, log=lambda m: None, purge=True)


if __name__ == "__main__":
    main()
