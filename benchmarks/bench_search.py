"""A search's driver (cluster): its own time per batch, for 1,000 trials in batches of 100, against
the time inside Slurm's commands, each measured in this run.

Each batch is what the driver does (sweeps.search): ask 100 trials (Optuna) and add them to the
manifest, submit them as one real job array (held behind a held job, then cancelled: nothing
runs), read the sweep's states (one squeue, one sacct), and tell the study how 100 trials ended
(each trial's logged loss is written as a finished trial would leave it). The driver's own time is
the batch's wall time minus the time inside sbatch/squeue/sacct. Optuna's ask is shown apart: it
grows with the trials for TPE (its Parzen estimators are fit on every trial so far, for each ask);
the random sampler's does not.

    python benchmarks/bench_search.py [--sampler tpe|random]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from submitit.core import utils

from slurmkit.common.sweep_layout import Manifest
from slurmkit.load.loader import load_profile
from slurmkit.slurm import commands
from slurmkit.sweeps import resolve, search, spec, study
from slurmkit.sweeps import submit as sub
from slurmkit.sweeps.results import TaskState, task_states

TRIALS, BATCH = 1000, 100
GOAL_S = 0.5


class Clock:
    """Seconds spent inside Slurm's commands: submitit's sbatch, and slurmkit.slurm.commands.run."""

    def __init__(self) -> None:
        self.inside = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside += time.perf_counter() - t0
        return timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sampler", default="tpe", choices=["tpe", "random"])
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-search-"))
    spec_path = tmp / "search.yaml"
    spec_path.write_text(yaml.safe_dump({
        "name": "bsearch", "command": "true", "resources": {"time": "00:05:00"},
        "sweep": {"search": {"sampler": args.sampler, "trials": TRIALS, "batch": BATCH, "metric": "loss", "params": {
            "env.LR": {"log_uniform": [1e-4, 0.1]}, "env.WIDTH": {"choice": [64, 128, 256]},
            "env.DROPOUT": {"uniform": [0.0, 0.5]}}}}}))
    profile = tmp / "p.yaml"
    profile.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp / "runs")}))

    clock = Clock()
    original_call = utils.CommandFunction.__call__
    utils.CommandFunction.__call__ = clock.wrap(original_call)  # type: ignore[method-assign]
    commands.run = clock.wrap(commands.run)

    plan = spec.load(spec_path)
    prof = load_profile(str(profile))
    paths = sub.create(plan, resolve.search_base(plan, str(profile), None, prof))
    assert plan.section.search is not None
    opened = study.open_study(paths, plan.section.search, None)
    blocker = subprocess.run(["sbatch", "--parsable", "--hold", "-t", "1", "--wrap", "true"], capture_output=True,
                             text=True, check=True).stdout.strip().split(";")[0]
    rows = []
    try:
        for k in range(TRIALS // BATCH):
            clock.inside = 0.0
            t0 = time.perf_counter()
            manifest = search.ask_batch(paths, Manifest(paths).read(), opened)
            ask_s = time.perf_counter() - t0
            indices = list(range(k * BATCH, (k + 1) * BATCH))
            search.submit_tasks(paths, manifest, indices, after=f"afterok:{blocker}")
            states = task_states(paths)
            driver_s = time.perf_counter() - t0
            for i in indices:  # what each trial leaves when it ends (the trials' time, not the driver's)
                task = paths.task(i)
                task.run_dir.mkdir(parents=True, exist_ok=True)
                lr = float(manifest.tasks[i].overrides["env.LR"])
                task.logged.write_text(json.dumps({"step": 1, "loss": lr * 10}) + "\n")
            t1 = time.perf_counter()
            search.tell_ended(paths, opened, [TaskState(i, "COMPLETED", "") for i in indices], "loss", {})
            tell_s = time.perf_counter() - t1
            own = driver_s + tell_s - clock.inside
            rows.append({"batch": k, "trials_before": k * BATCH, "ask_s": round(ask_s, 3), "tell_s": round(tell_s, 3),
                         "inside_slurm_s": round(clock.inside, 3), "driver_own_s": round(own, 3),
                         "own_vs_slurm": round(own / clock.inside, 2), "tasks_seen": len(states)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        arrays = [a.job_id for a in Manifest(paths).read().arrays if a.job_id]
        subprocess.run(["scancel", blocker, *arrays], check=False)
    own_wo_ask = [r["driver_own_s"] - r["ask_s"] for r in rows]
    print(json.dumps({
        "sampler": args.sampler, "trials": TRIALS, "batch": BATCH, "arrays": len(rows),
        "driver_own_s_per_batch_max": max(r["driver_own_s"] for r in rows),
        "driver_own_s_per_batch_median": sorted(r["driver_own_s"] for r in rows)[len(rows) // 2],
        "without_optuna_ask_max_s": round(max(own_wo_ask), 3),
        "optuna_ask_s_first_last": [rows[0]["ask_s"], rows[-1]["ask_s"]],
        "inside_slurm_s_per_batch_median": sorted(r["inside_slurm_s"] for r in rows)[len(rows) // 2],
        "goal_own_s": GOAL_S}))


if __name__ == "__main__":
    main()
