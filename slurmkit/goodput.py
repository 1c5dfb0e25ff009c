"""Goodput accounting of a run across all its jobs and incarnations (login side; no torch).

- wall: from the first incarnation's start to the last one's end (now, while running);
- productive: the step time of every step that counts (the last execution of each step);
- lost, split into: queue wait (submit or requeue -> running again), restart overhead (running ->
  the first step of that incarnation), recomputed steps (steps run again after a restart), checkpoint
  stalls (time a step waited on a save), and the rest (final save, exit, evaluation, teardown).

goodput = productive / wall. Incarnations come from one `sacct --duplicates` call for every job id.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurmkit.slurm.commands import Incarnation
from slurmkit.worker.metrics import read_records


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    productive_s: float
    queue_wait_s: float
    restart_overhead_s: float
    recomputed_s: float
    checkpoint_stall_s: float
    other_s: float
    goodput: float
    steps: int

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def incarnations(job_ids: list[str]) -> list[Incarnation]:
    """Every incarnation of every job, oldest first (one sacct call)."""
    from slurmkit.slurm import commands

    found = [inc for info in commands.sacct(job_ids).values() for inc in info.history]
    return sorted(found, key=lambda i: i.start or i.submit or 0.0)


def local_incarnation(steps: list[dict[str, Any]]) -> Incarnation:
    """Without accounting (a local run): the run's own clock, from the start of its first step to its last."""
    first = float(steps[0]["time"]) - float(steps[0].get("step_s", 0.0))
    return Incarnation("local", None, first, float(steps[-1]["time"]), "LOCAL", "this machine")


def restart_overheads(steps: list[dict[str, Any]], incs: list[Incarnation]) -> list[float]:
    """For each incarnation after the first: seconds from running again to the end of its first step."""
    out = []
    for inc in incs[1:]:
        if inc.start is None:
            continue
        firsts = [float(r["time"]) for r in steps if float(r.get("time", 0.0)) >= inc.start]
        if firsts:
            out.append(min(firsts) - inc.start)
    return out


def account(steps: list[dict[str, Any]], incs: list[Incarnation], now: float | None = None) -> Goodput:
    """Split the wall time of a run into productive and lost time."""
    now = now or time.time()
    started = [i for i in incs if i.start is not None]
    if not started and steps:
        started = [local_incarnation(steps)]
    if not started:
        return Goodput(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    first = started[0].start or 0.0
    last = max((i.end or now) for i in started)
    wall = max(last - first, 1e-9)
    final: dict[int, dict[str, Any]] = {}
    for rec in steps:
        final[int(rec["step"])] = rec
    productive = sum(float(r.get("step_s", 0.0)) for r in final.values())
    recomputed = sum(float(r.get("step_s", 0.0)) for r in steps) - productive
    stalls = sum(float(r.get("ckpt_stall_s", 0.0)) for r in steps)
    queue = sum(max(0.0, (b.start or 0.0) - (a.end or b.start or 0.0)) for a, b in zip(started, started[1:],
                                                                                         strict=False))
    restart = sum(restart_overheads(steps, started))
    other = wall - productive - recomputed - stalls - queue - restart
    return Goodput(wall, productive, queue, restart, recomputed, stalls, max(other, 0.0), productive / wall,
                   len(final))


def of_run(run_dir: Path, job_ids: list[str]) -> tuple[Goodput, list[Incarnation]]:
    from slurmkit.runs import RunPaths

    incs = incarnations(job_ids)
    return account(read_records(RunPaths(run_dir).metrics), incs), incs
