"""Node loss on the dev cluster (2 nodes x 1 rank, gloo): a spare node against a requeue.

The dev cluster is brought up with a third node for the run and back to two after. Two runs of
the same training, in the same session: one with `resources.spare_nodes: 1` (3 nodes allocated,
the ranks on 2, `--no-kill`), one without (Slurm requeues the job on NODE_FAIL), each `--repeats`
times. In each run node2 is set DOWN once, at a random step (ReturnToService=2 brings it back at
once; the one spare is then spent: it has left the job). Recovery
is the time from `scontrol update State=DOWN` to the end of the first step of the restarted
ranks (its metrics record, which carries `startup`). The figure is the ratio requeue / spare,
each path against the floor measured in the same run (two bare processes importing torch and
torch._dynamo at once, as the two ranks do), and the spare path's Slurm incarnations (goal: one).

Usage: python benchmarks/bench_node_loss.py [--repeats 2] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from bench_crash import first_step_after, import_floor_s, last_step

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.devcluster import cluster as dc
from slurmkit.insight import goodput
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs


def one_run(tmp: Path, spares: int, steps: int, rng: random.Random) -> dict[str, Any]:
    """One run, node2 lost once: seconds to the first step back, in-job restarts, Slurm incarnations."""
    profile = tmp / f"p{spares}.yaml"
    profile.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp / "runs")}))
    sets = ["resources.nodes=2", f"resources.spare_nodes={spares}", "resources.tasks_per_node=1",
            f"config.steps={steps}", "config.checkpoint_every=20", "config.batch_size=8", "config.log_every=20"]
    sub = jobs.submit(resolve("examples/train_gpt.yaml", str(profile), sets))
    assert sub.job_id
    paths = RunPaths(Path(sub.run_dir))
    target = rng.randint(60, 120)
    while last_step(paths) < target:
        time.sleep(0.05)
    lost = time.time()
    subprocess.run(["scontrol", "update", "NodeName=node2", "State=DOWN", "Reason=bench"], check=True)
    try:
        while (back := first_step_after(paths, lost)) is None:
            if not jobs.is_active(jobs.run_state(paths).state):
                raise SystemExit(f"the run ended instead of restarting: {jobs.run_state(paths).state}")
            time.sleep(0.2)
    finally:
        subprocess.run(["scontrol", "update", "NodeName=node2", "State=RESUME"], check=False, capture_output=True)
    print(f"spares={spares}: back after {back - lost:.1f} s", file=sys.stderr, flush=True)
    state = jobs.wait(paths, timeout_s=600).state
    restarts = RunFile(paths).read().restarts
    assert state == "COMPLETED", state
    assert [r.cause for r in restarts] == ["node_failure"], restarts
    return {"recovery_s": round(back - lost, 2), "in_job": bool(restarts[0].in_job),
            "incarnations": len(goodput.incarnations([sub.job_id]))}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"runs": runs, "median_s": round(statistics.median(r["recovery_s"] for r in runs), 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-node-loss-"))
    dc.up(3, log=lambda _: None)
    try:
        floor = import_floor_s()
        spare = summary([one_run(tmp, 1, args.steps, rng) for _ in range(args.repeats)])
        requeue = summary([one_run(tmp, 0, args.steps, rng) for _ in range(args.repeats)])
    finally:
        dc.up(2, log=lambda _: None)
    print(json.dumps({
        "import_floor_s": round(floor, 2), "spare": spare, "requeue": requeue,
        "requeue_over_spare": round(requeue["median_s"] / spare["median_s"], 2),
        "spare_over_floor": round(spare["median_s"] / floor, 2),
    }, indent=1))


if __name__ == "__main__":
    main()
