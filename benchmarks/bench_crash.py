"""Crash recovery on the dev cluster (2 nodes x 1 rank, gloo): warm and cold in-job restarts, and a
hang, against a requeue.

Runs of the same training, in the same session:
- warm: the last rank raises at random steps (`config.faults.transient_error_at_steps`), its process
  and its peer's live on, and both restart in the process (slurmkit.worker.train.warm). The fault time
  is rank 0's catch of the failure (`warm_restart.failed_at` of the first step back, about 1 ms
  after the raise);
- cold: rank 1 is SIGKILLed at a random step, once the standby ranks for the next attempt have
  paid their imports (their "ready" line; a second fault a few seconds after the first, while
  they still import, waits for them); srun ends the step and the batch shell hands the next
  attempt to them (slurmkit.worker.standby, `requeue.in_job: 2`);
- fresh: the same with `requeue.standby: false`: a new srun step of fresh interpreters;
- hang: rank 1 is SIGSTOPped; rank 0's watchdog (`hang_timeout_s` 5) gives up, then as cold. Its
  figure is from the watchdog's firing (the time in its hang marker) to the first step back;
- requeue: the SIGKILLs with `requeue.in_job: 0`: every crash goes through Slurm's queue.
`--crashes` faults a run. Recovery is the time from the fault to the end of the first step back
(its metrics record: `warm_restart`, or `startup` for a new process). The figures are requeue /
each path, and each path against the floor measured in the same run: two bare processes
importing torch and torch._dynamo at once, as the two ranks of a new step do.

Usage: python benchmarks/bench_crash.py [--crashes 2] [--steps 400] [--paths warm,cold,...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import iter_records
from slurmkit.common.record import RunFile
from slurmkit.devcluster import ranks
from slurmkit.insight import goodput
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs
from slurmkit.worker import standby

PATHS = ("warm", "cold", "fresh", "hang", "requeue")
HANG_TIMEOUT_S = 5


def import_floor_s() -> float:
    """Two processes importing what a rank imports before its first step, started together."""
    code = "import torch, torch._dynamo"
    began = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]
    for p in procs:
        p.wait()
    return time.monotonic() - began


def last_step(paths: RunPaths) -> int:
    steps = [int(r["step"]) for r in iter_records(paths.metrics) if "step" in r]
    return max(steps, default=0)


def first_step_after(paths: RunPaths, t: float) -> float | None:
    """End time of the first step a restarted rank 0 logged after `t` (the record with `startup`)."""
    return next((float(r["time"]) for r in iter_records(paths.metrics) if "startup" in r and float(r["time"]) > t),
                None)


def warm_backs(paths: RunPaths) -> list[float]:
    """Fault to the end of the first step back, of each warm restart."""
    return [float(r["time"]) - float(r["warm_restart"]["failed_at"])
            for r in iter_records(paths.metrics) if "warm_restart" in r]


def standby_ready(paths: RunPaths, job_id: str, attempt: int) -> bool:
    """Every rank's standby process for in-job attempt `attempt` has said it is ready."""
    line = standby.ready_line(attempt)
    logs = [paths.rank_log(job_id, rank, "err") for rank in (0, 1)]
    return all(log.exists() and line in log.read_text(errors="replace") for log in logs)


def one_run(tmp: Path, path: str, crashes: int, steps: int, rng: random.Random) -> dict[str, Any]:
    in_job = 0 if path == "requeue" else crashes
    profile = tmp / f"{path}.yaml"
    profile.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp / "runs"), "requeue": {
        "crash": crashes + 1, "hang": crashes + 1, "in_job": in_job, "standby": path != "fresh"}}))
    sets = ["resources.nodes=2", "resources.tasks_per_node=1", f"config.steps={steps}", "config.checkpoint_every=20",
            "config.batch_size=8", "config.log_every=20", f"config.hang_timeout_s={HANG_TIMEOUT_S}"]
    if path == "warm":
        at = sorted(rng.sample(range(40, steps - 40, 40), crashes))
        sets += [f"config.faults.transient_error_at_steps=[{','.join(str(s + rng.randint(1, 19)) for s in at)}]"]
    sub = jobs.submit(resolve("examples/train_gpt.yaml", str(profile), sets))
    assert sub.job_id
    paths = RunPaths(Path(sub.run_dir))
    recoveries: list[float] = []
    for k in range(0 if path == "warm" else crashes):
        if path in ("cold", "hang"):  # the standby ranks of this attempt have paid their imports
            while not standby_ready(paths, sub.job_id, k + 1):
                time.sleep(0.05)
        target = last_step(paths) + rng.randint(20, 60)
        while last_step(paths) < target:
            time.sleep(0.05)
        pid = ranks.rank_pid(paths, 1)
        killed = time.time()
        os.kill(pid, signal.SIGSTOP if path == "hang" else signal.SIGKILL)
        while (back := first_step_after(paths, killed)) is None:
            if not jobs.is_active(jobs.run_state(paths).state):
                raise SystemExit(f"the run ended instead of restarting: {jobs.run_state(paths).state}")
            time.sleep(0.2)
        if path == "hang":  # from the watchdog's firing (its marker, kept as the restart's detail)
            killed = float(json.loads(RunFile(paths).read().restarts[-1].detail)["time"])
        recoveries.append(back - killed)
        print(f"{path} crash {k + 1}: back after {back - killed:.1f} s", file=sys.stderr, flush=True)
    state = jobs.wait(paths, timeout_s=600).state
    restarts = RunFile(paths).read().restarts
    assert state == "COMPLETED", state
    assert [r.cause for r in restarts] == ["hang" if path == "hang" else "crash"] * crashes, restarts
    if path == "warm":
        recoveries = warm_backs(paths)
        assert len(recoveries) == crashes and all(r.kind == "warm" for r in restarts), restarts
    return {"recovery_s": [round(x, 3) for x in recoveries], "median_s": round(statistics.median(recoveries), 3),
            "in_job_restarts": sum(1 for r in restarts if r.in_job),
            "incarnations": len(goodput.incarnations([sub.job_id]))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--crashes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paths", default=",".join(PATHS), help="a comma-separated subset; requeue is the baseline")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-crash-"))
    floor = import_floor_s()
    chosen = [p for p in PATHS if p in args.paths.split(",") or p == "requeue"]
    runs = {path: one_run(tmp, path, args.crashes, args.steps, rng) for path in chosen}
    medians = {path: run["median_s"] for path, run in runs.items()}
    print(json.dumps({
        "crashes": args.crashes, "import_floor_s": round(floor, 2), "hang_timeout_s": HANG_TIMEOUT_S, **runs,
        **{f"requeue_over_{p}": round(medians["requeue"] / m, 2) for p, m in medians.items() if p != "requeue"},
        **{f"{p}_over_floor": round(m / floor, 3) for p, m in medians.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
