"""Goodput accounting of a run across all its jobs and incarnations (login side; no torch).

- wall: from the first incarnation's start to the last one's end (now, while running);
- productive: the step time of every step that counts (the last execution of each step);
- lost, split into: queue wait (between incarnations: one ending -> the next running; the wait
  before the first start is not counted, the run had not begun), restart overhead (running ->
  the first step of that incarnation), recomputed steps (steps run again after a restart), checkpoint
  stalls (time a step waited on a save), and the rest (final save, exit, evaluation, teardown).

goodput = productive / wall. Incarnations come from one `sacct --duplicates` call for every job id.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurmkit.common.metrics import read_records
from slurmkit.slurm.parse import Incarnation


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


def typical_step(steps: list[dict[str, Any]]) -> float:
    """The median step time: what a step costs once an incarnation is warm."""
    times = sorted(float(r.get("step_s", 0.0)) for r in steps)
    return times[len(times) // 2] if times else 0.0


def first_steps(steps: list[dict[str, Any]], incs: list[Incarnation]) -> list[tuple[Incarnation, dict[str, Any]]]:
    """Each started incarnation with the first step it ran (incarnations that ran none are left out).

    A step belongs to the incarnation that started last before it (sacct's times are whole seconds).
    """
    started = sorted((i for i in incs if i.start is not None), key=lambda i: i.start or 0.0)
    out = []
    for inc, after in zip(started, [*started[1:], None], strict=True):
        end = after.start if after is not None and after.start is not None else float("inf")
        ran = [r for r in steps if (inc.start or 0.0) <= float(r.get("time", 0.0)) < end]
        if ran:
            out.append((inc, min(ran, key=lambda r: float(r["time"]))))
    return out


def restart_overheads(steps: list[dict[str, Any]], incs: list[Incarnation]) -> list[float]:
    """For each incarnation after the first: seconds from running again until training is back at speed.

    That is until its first step began, plus what that step took beyond a typical step: the
    first step pays for work deferred to it (torch._dynamo's import, allocator warm-up), and that
    part is restart cost, not training.
    """
    return _restarts(first_steps(steps, incs), typical_step(steps))


def _restarts(firsts: list[tuple[Incarnation, dict[str, Any]]], typical: float) -> list[float]:
    out = []
    for inc, rec in firsts[1:]:
        step_s = float(rec.get("step_s", 0.0))
        began = float(rec["time"]) - step_s
        out.append(max(0.0, began - (inc.start or began)) + max(0.0, step_s - typical))
    return out


def startup_spans(inc: Incarnation, marks: dict[str, float]) -> dict[str, float]:
    """Seconds spent in each start-up phase of one incarnation (a first step's `startup` record):
    `launch` from Slurm's start to the process, then each phase the worker marked, in order."""
    launched = inc.start is not None and marks["process_start"] >= inc.start  # not for a local run's own clock
    spans = {"launch": round(marks["process_start"] - (inc.start or 0.0), 2)} if launched else {}
    prev = 0.0
    for phase, at in marks.items():
        if phase != "process_start":
            spans[phase], prev = round(max(0.0, at - prev), 2), at
    return spans


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
    typical = typical_step(steps)
    firsts = first_steps(steps, started)
    warm_up = {id(rec) for _, rec in firsts}

    def useful(rec: dict[str, Any]) -> float:
        step_s = float(rec.get("step_s", 0.0))
        return min(step_s, typical) if id(rec) in warm_up else step_s

    final: dict[int, dict[str, Any]] = {}
    for rec in steps:
        final[int(rec["step"])] = rec
    productive = sum(useful(r) for r in final.values())
    recomputed = sum(useful(r) for r in steps) - productive
    stalls = sum(float(r.get("ckpt_stall_s", 0.0)) for r in steps)
    queue = sum(max(0.0, (b.start or 0.0) - (a.end or b.start or 0.0)) for a, b in zip(started, started[1:],
                                                                                         strict=False))
    restart = sum(_restarts(firsts, typical))
    other = wall - productive - recomputed - stalls - queue - restart
    return Goodput(wall, productive, queue, restart, recomputed, stalls, max(other, 0.0), productive / wall,
                   len(final))


def of_run(run_dir: Path, job_ids: list[str]) -> tuple[Goodput, list[Incarnation]]:
    from slurmkit.runs import RunPaths

    incs = incarnations(job_ids)
    return account(read_records(RunPaths(run_dir).metrics), incs), incs
