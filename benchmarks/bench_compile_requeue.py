"""config.compile through a requeue on the dev cluster: restart to the first step, compiled against eager.

The GPT example on 2 nodes x 1 rank (gloo), `--pairs` eager/compiled pairs, alternating. Each run
gets the profile's signal (scancel --signal=USR2, a preemption as the dev cluster delivers it) once
it has trained `--at` steps: the ranks stop at one agreed step, save, and the job is requeued. The
requeued incarnation's rank 0 restarts with the run's compile cache (config.compile) or without
compile. Two figures per run, from its first step's metrics record (the one with `startup`):
- process: the rank's process start to the end of its first step (imports, rendezvous, build,
  restore, the first step with its compile);
- requeue: the signal to the end of that step (what a user waits; Slurm's requeue delay is in it).
The ratio compiled / eager of each is the figure (goal: process <= 1.5x, issue 53).

Usage: slurmkit devcluster up --nodes 2 && python benchmarks/bench_compile_requeue.py [--pairs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from bench_crash import first_step_after, last_step

from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import read_records
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs

ROOT = Path(__file__).resolve().parent.parent
SETS = ["resources.nodes=2", "resources.tasks_per_node=1", "config.steps=80", "config.batch_size=8",
        "config.checkpoint_every=1000", "config.log_every=1", "config.log_min_interval_s=0"]


def one_run(tmp: Path, compiled: bool, at: int) -> dict[str, Any]:
    profile = tmp / "p.yaml"
    profile.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp / "runs"),
                                       "requeue": {"standby": False}}))
    sub = jobs.submit(resolve(str(ROOT / "examples" / "train_gpt.yaml"), str(profile),
                              [*SETS, f"config.compile={str(compiled).lower()}"]))
    assert sub.job_id
    paths = RunPaths(Path(sub.run_dir))
    while last_step(paths) < at:
        time.sleep(0.05)
    signalled = time.time()
    subprocess.run(["scancel", "--signal=USR2", sub.job_id], check=True, timeout=30)
    while first_step_after(paths, signalled) is None:
        if not jobs.is_active(jobs.run_state(paths).state):
            raise SystemExit(f"the run ended instead of requeueing: {jobs.run_state(paths).state}")
        time.sleep(0.2)
    if jobs.wait(paths, timeout_s=600).state != "COMPLETED":
        raise SystemExit(f"{sub.run_id} did not complete")
    again = [r for r in read_records(paths.metrics) if "startup" in r][-1]
    back = float(again["time"])
    return {"process_s": round(float(again["startup"]["first_step"]) + float(again["step_s"]), 2),
            "requeue_s": round(back - signalled, 2), "compile_cache": again.get("compile_cache"),
            "startup": again["startup"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--at", type=int, default=30, help="the step after which the run is signalled")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-compile-requeue-"))
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for _ in range(args.pairs):
        for compiled in (False, True):
            runs[compiled].append(one_run(tmp, compiled, args.at))
    out: dict[str, Any] = {}
    for key in ("process_s", "requeue_s"):
        eager, comp = (statistics.median(r[key] for r in runs[c]) for c in (False, True))
        out[key] = {"eager": eager, "compiled": comp, "ratio": round(comp / eager, 2)}
    out["compiled_runs"] = runs[True]
    out["eager_runs"] = runs[False]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
