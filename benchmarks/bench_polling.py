"""Load on slurmctld from waiting: Slurm calls per minute over a 10-minute `submit --wait` of one
job and a `sweep --wait` of 100,000 tasks.

Simulated: a stub squeue/sacct (shell scripts on PATH) records each call with the simulated time
and answers from a script of states (RUNNING for 10 minutes, then COMPLETED in sacct), and the
Poller sleeps on a simulated clock, so 10 minutes take seconds. The subject is slurmkit's own
polling, not Slurm. Baseline, in the same run: the fixed 2 s poll slurmkit had before.

    python benchmarks/bench_polling.py [--tasks 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

WAIT_S = 600.0
FIXED_POLL_S = 2.0

STUB = """#!/bin/bash
now=$(cat "$STUB_DIR/clock")
echo "$now $(basename "$0")" >> "$STUB_DIR/calls.log"
if awk -v t="$now" 'BEGIN { exit !(t < {wait}) }'; then phase=running; else phase=done; fi
case "$(basename "$0")" in
  squeue) [ "$phase" = running ] && cat "$STUB_DIR/squeue.txt" ;;
  sacct) [ "$phase" = done ] && cat "$STUB_DIR/sacct.txt" ;;
esac
exit 0
"""


class SimulatedClock:
    """The Poller's clock and sleep; the stubs read the same time from a file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.now = 0.0
        path.write_text("0")

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.path.write_text(f"{self.now:.3f}")


def stub_slurm(folder: Path, job_ids: list[str]) -> None:
    for name in ("squeue", "sacct"):
        path = folder / name
        path.write_text(STUB.replace("{wait}", str(WAIT_S)))
        path.chmod(0o755)
    (folder / "squeue.txt").write_text("".join(f"{j}|RUNNING|None|node1|5:00|{j}\n" for j in job_ids))
    t = "2026-12-01T10:00:00"
    (folder / "sacct.txt").write_text("".join(f"{j}|COMPLETED||node1|00:10:00|0:0|{t}|{t}|{t}\n" for j in job_ids))


def per_minute(log: Path) -> list[int]:
    minutes: Counter[int] = Counter()
    for line in log.read_text().splitlines():
        minutes[min(int(float(line.split()[0]) // 60), int(WAIT_S // 60))] += 1
    return [minutes[m] for m in range(int(WAIT_S // 60) + 1)]


def measure(folder: Path, wait: Any, fixed: bool) -> dict[str, Any]:
    from slurmkit.runs.polling import Poller

    log = folder / "calls.log"
    log.unlink(missing_ok=True)
    clock = SimulatedClock(folder / "clock")
    first = FIXED_POLL_S if fixed else 1.0
    poller = Poller(first_s=first, max_s=first if fixed else 30.0, clock=clock, sleep=clock.sleep)
    state = wait(poller)
    minutes = per_minute(log)
    return {"final": state, "calls": sum(minutes), "calls_per_minute": minutes}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100_000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-polling-"))
    stubs = tmp / "stub-slurm"
    stubs.mkdir()
    os.environ["STUB_DIR"] = str(stubs)
    os.environ["PATH"] = f"{stubs}{os.pathsep}{os.environ['PATH']}"

    from slurmkit.common.layout import RunPaths
    from slurmkit.common.record import RunFile, RunRecord
    from slurmkit.common.sweep_layout import ArrayEntry, ArrayLog
    from slurmkit.runs import jobs
    from slurmkit.sweeps import results, spec
    from slurmkit.sweeps import submit as sub
    from slurmkit.sweeps.resolve import resolve_tasks

    # One run whose job is 1001; one sweep of N tasks in arrays of 10,001.
    run = RunPaths(tmp / "runs" / "one")
    RunFile(run).create(RunRecord(run_id="one", executor="slurm", job_ids=["1001"]))
    profile = tmp / "p.yaml"
    profile.write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp / "runs")}))
    sweep_spec = tmp / "sweep.yaml"
    sweep_spec.write_text(yaml.safe_dump({"name": "poll", "command": "true", "sweep": {"grid": {
        "env.A": list(range(args.tasks // 100)), "env.B": list(range(100))}}}))
    plan = spec.load(sweep_spec)
    sweep = sub.create(plan, resolve_tasks(plan, str(profile)))
    size = 10_001
    with ArrayLog(sweep).editing() as log:
        log.arrays = [ArrayEntry(indices=list(range(b, min(b + size, args.tasks))), base=b, job_id=str(2000 + k),
                                 kind="initial") for k, b in enumerate(range(0, args.tasks, size))]
    task_ids = [f"{2000 + i // size}_{i % size}" for i in range(args.tasks)]

    out: dict[str, Any] = {"wait_s": WAIT_S, "sweep_tasks": args.tasks}
    stub_slurm(stubs, ["1001"])
    for fixed in (False, True):
        key = "submit_wait" + ("_fixed_2s" if fixed else "")
        out[key] = measure(stubs, lambda p: jobs.wait(run, poller=p).state, fixed)
    stub_slurm(stubs, task_ids)
    for fixed in (False, True):
        key = "sweep_wait" + ("_fixed_2s" if fixed else "")
        out[key] = measure(stubs, lambda p: results.counts(results.wait(sweep, poller=p)), fixed)
    for name in ("submit_wait", "sweep_wait"):
        out[f"{name}_calls_ratio"] = round(out[name]["calls"] / out[f"{name}_fixed_2s"]["calls"], 3)
        out[f"{name}_max_calls_per_minute"] = max(out[name]["calls_per_minute"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
