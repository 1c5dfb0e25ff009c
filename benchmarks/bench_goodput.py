"""Goodput under repeated preemption on the dev cluster (2 nodes x 1 rank, gloo, ~1 s steps).

A fault is injected after every ~60 s of RUNNING time, one of three ways (--mode):
- usr2: the signal Slurm sends before a limit, by hand (scancel --signal=USR2);
- partition: real Slurm preemption, a plain 2-node `sbatch -p urgent --exclusive` job that needs
  the run's nodes (the dev cluster's debug partition: PreemptMode=REQUEUE, GraceTime=20 s);
- crash: the last rank raises at a step of every ~60 s (`config.faults.transient_error_at_steps`,
  at `--step-s` seconds a step, as measured here), and the ranks restart warm, in their processes.
Runtime goodput = productive step time / time the job was RUNNING (sacct, every incarnation);
queue wait is reported apart, and so is the goodput past what every run pays once however it
fails (its first start and its last exit), which does not shrink with fewer faults, only with a
longer run. The baseline is the usual submitit + DDP pattern measured on the
same cluster (shared/notes/preemption-facts.md): 0.81. Also reported: seconds from the signal to
the job's exit (final save included), and from RUNNING again to the first step.

Usage: python benchmarks/bench_goodput.py [--mode usr2|partition|crash] [--steps 240] [--every 60] [--interval 20]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import busy_s
from slurmkit.common.record import RunFile
from slurmkit.insight import goodput
from slurmkit.load.loader import resolve
from slurmkit.runs import jobs
from slurmkit.slurm.parse import Incarnation

BASELINE_GOODPUT = 0.81  # the usual submitit + DDP pattern, same cluster, a preemption every 60 s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["usr2", "partition", "crash"], default="usr2")
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--every", type=float, default=60.0, help="seconds of RUNNING between preemptions")
    parser.add_argument("--interval", type=int, default=20, help="checkpoint_every (steps)")
    parser.add_argument("--step-s", type=float, default=0.9, help="--mode crash: the step time the fault steps assume")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-goodput-"))
    # Budgets for every fault of the run: what is measured is the cost of each, not the policy's end.
    (tmp / "p.yaml").write_text(yaml.safe_dump({"extends": "devcluster", "run_root": str(tmp / "runs"),
                                                "resources": {"time": "00:30:00"},
                                                "requeue": {"preemption": 50, "crash": 50, "in_job": 50}}))
    sets = ["resources.nodes=2", "resources.tasks_per_node=1", f"config.steps={args.steps}",
            f"config.checkpoint_every={args.interval}", "config.d_model=512", "config.n_layer=3",
            "config.n_head=8", "config.seq_len=128", "config.batch_size=16", "config.log_every=20"]
    if args.mode == "crash":
        at = crash_steps(args.steps, args.every, args.step_s)
        sets.append(f"config.faults.transient_error_at_steps=[{','.join(map(str, at))}]")
    sub = jobs.submit(resolve("examples/train_gpt.yaml", str(tmp / "p.yaml"), sets))
    paths = RunPaths(Path(sub.run_dir))
    assert sub.job_id
    signals: list[float] = []
    running_since: float | None = None
    while True:
        state = jobs.run_state(paths).state
        now = time.time()
        if state == "RUNNING" and args.mode != "crash":
            running_since = running_since or now
            if now - running_since >= args.every:
                preempt(args.mode, sub.job_id)
                signals.append(now)
                running_since = None
                time.sleep(3)
        else:
            running_since = None
            if not jobs.is_active(state):
                break
        time.sleep(0.5)
    incs = goodput.incarnations([sub.job_id])
    acc = goodput.of_file(paths.metrics, incs)
    gp = acc.result()
    running = sum((i.end or 0.0) - (i.start or 0.0) for i in incs if i.start)
    restart = acc.restart_overheads()
    startups = [(inc, rec["startup"]) for inc, rec in acc.firsts()[1:] if "startup" in rec]
    # sacct's End is a whole second, which may read as just before a sub-second signal.
    exits = [max(0.0, min((i.end for i in incs if i.end and i.end >= int(s)), default=s) - s) for s in signals]
    runtime_goodput = gp.productive_s / running if running else 0.0
    start_s, end_s = once_s(acc, incs)
    restarts = RunFile(paths).read().restarts
    lost_steps = [r.lost_steps for r in restarts]
    print(json.dumps({
        "mode": args.mode, "lost_steps": lost_steps, "steps": args.steps,
        "faults": len(signals) if args.mode != "crash" else len(lost_steps),
        "warm_restarts": sum(1 for r in restarts if r.kind == "warm"),
        "checkpoint_every": args.interval,
        "incarnations": len(incs), "final": incs[-1].state,
        "running_s": round(running, 1), "productive_s": round(gp.productive_s, 1),
        "runtime_goodput": round(runtime_goodput, 3), "baseline_goodput": BASELINE_GOODPUT,
        "goodput_vs_baseline": round(runtime_goodput / BASELINE_GOODPUT, 3),
        "wall_goodput": round(gp.goodput, 3), "lost_s": gp.as_dict(),
        "first_start_s": round(start_s, 1), "last_exit_s": round(end_s, 1),
        "goodput_past_start_and_exit": round(gp.productive_s / (running - start_s - end_s), 3) if running else 0.0,
        "signal_to_exit_s": [round(x, 1) for x in exits], "restart_to_first_step_s": [round(x, 1) for x in restart],
        "median_step_s": round(acc.typical, 3),
        "restart_phases_median_s": phase_medians(startups),
    }, indent=1))


def once_s(acc: goodput.Accountant, incs: list[Incarnation]) -> tuple[float, float]:
    """What a run pays once whatever its faults, in "other": the first incarnation's start to its
    first step, and the last step's end to the job's end (final save, exit)."""
    firsts = acc.firsts()
    if not firsts or acc.newest is None or not incs:
        return 0.0, 0.0
    inc, rec = firsts[0]
    start = float(rec["time"]) - busy_s(rec) - (inc.start or 0.0)
    return max(0.0, start), max(0.0, (incs[-1].end or 0.0) - float(acc.newest["time"]))


def crash_steps(steps: int, every_s: float, step_s: float) -> list[int]:
    """A step of every ~`every_s` seconds at `step_s` a step, each at a random offset."""
    per = max(2, round(every_s / step_s))
    rng = random.Random(0)
    return [k + rng.randint(-per // 10, per // 10) for k in range(per, steps - per // 2, per)]


def preempt(mode: str, job_id: str) -> None:
    if mode == "usr2":
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
        return
    from slurmkit.devcluster import names

    subprocess.run(["sbatch", "-p", names.URGENT_PARTITION, "-N", "2", "--exclusive", "-t", "2", "-o", "/dev/null",
                    "--wrap", "sleep 3"], check=True, capture_output=True)


def phase_medians(startups: list[tuple[Incarnation, dict[str, float]]]) -> dict[str, float]:
    """Median seconds of each start-up phase over the restarts."""
    spans: dict[str, list[float]] = {}
    for inc, marks in startups:
        for phase, secs in goodput.startup_spans(inc, marks).items():
            spans.setdefault(phase, []).append(secs)
    return {k: round(statistics.median(v), 2) for k, v in spans.items()}


if __name__ == "__main__":
    main()
