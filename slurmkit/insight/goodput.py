"""Goodput accounting of a run across all its jobs and incarnations (login side; no torch).

- wall: from the first incarnation's start to the last one's end (now, while running);
- productive: the step time of every step that counts (the last execution of each step);
- lost, split into: queue wait (between incarnations: one ending -> the next running; the wait
  before the first start is not counted, the run had not begun), restart overhead (running ->
  the first step of that incarnation; and for an in-job restart, a new srun step or a warm restart
  inside an incarnation, from the step before it to its first step), staging (profile stage: the
  environment and data copied to the nodes' local disks, the slowest node's, out of the restart
  overhead it is part of, or the first start's other time), recomputed steps (steps run again
  after a restart), checkpoint stalls (time a step waited on a save), and the rest (final save,
  exit, evaluation, teardown).

goodput = productive / wall. Incarnations come from one `sacct --duplicates` call for every job id.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import busy_s, iter_records, iter_records_reversed, steps_of
from slurmkit.common.record import RunRecord
from slurmkit.jsontypes import JsonObject
from slurmkit.slurm import commands
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
    staging_s: float = 0.0

    def as_dict(self) -> JsonObject:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def incarnations(job_ids: list[str]) -> list[Incarnation]:
    """Every incarnation of every job, oldest first (one sacct call)."""
    found = [inc for info in commands.sacct_or_warn(job_ids).values() for inc in info.history]
    return sorted(found, key=lambda i: i.start or i.submit or 0.0)


def local_incarnation(oldest: JsonObject, newest: JsonObject) -> Incarnation:
    """Without accounting or a run record (metrics alone): the run's own clock, from the start of its
    first step to its last."""
    return Incarnation("local", None, float(oldest["time"]) - busy_s(oldest), float(newest["time"]), "LOCAL",
                       "this machine")


def run_incarnations(paths: RunPaths, record: RunRecord) -> list[Incarnation]:
    """A run's incarnations: Slurm's accounting for a Slurm run (one sacct call). A local run has
    one, on this machine's clock: from its controller's start (run.json's `created` where that is
    not known) to the last its ranks wrote (their outcome records, its metrics), so start-up counts
    as the job's time; in the state its ranks' outcome records say (UNKNOWN while they have not all
    ended, or when a rank was killed)."""
    if record.executor == "slurm":
        return incarnations(record.job_ids)
    job_id = record.job_ids[-1] if record.job_ids else ""
    start = _ticks_epoch(record.pid_starts.get(job_id)) or iso_epoch(record.created)
    ends = [iso_epoch(o.time) for r in paths.outcome_ranks(job_id) if (o := paths.outcome(job_id, r)) is not None]
    ends += [float(rec["time"]) for log in (paths.metrics, paths.logged)
             for rec in itertools.islice(iter_records_reversed(log), 1) if "time" in rec]
    state = paths.outcome_state(job_id, record.num_tasks) if job_id else "UNKNOWN"
    end = max((e for e in ends if e is not None), default=None)
    return [Incarnation(job_id or "local", start, start, end, state, "this machine")]


def iso_epoch(iso: object) -> float | None:
    """run.json's and the outcome records' local ISO times as epoch seconds."""
    try:
        return dt.datetime.fromisoformat(str(iso)).timestamp()
    except ValueError:
        return None


def _ticks_epoch(ticks: int | None) -> float | None:
    """A process start in clock ticks since boot (runs.procs) as epoch seconds, on this machine."""
    try:
        boot = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime"))
    except (OSError, StopIteration, ValueError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK") if ticks is not None else None


def step_bucket(step_s: float) -> float:
    """A step time as the typical step's histogram keeps it: 4 significant digits, so the histogram
    holds a bounded number of distinct values however long the run."""
    return float(f"{step_s:.4g}")


class Accountant:
    """The goodput of a run, from its metrics records fed newest first: one pass, and memory that
    does not grow with the number of records (a few values per incarnation, a histogram of step times).

    A step counts as productive in its last execution: reading backwards, a record's steps already
    run by a newer record are recomputed (pro rata within an interval record).
    """

    def __init__(self, incs: list[Incarnation], staging_s: float = 0.0) -> None:
        self.staging_s = staging_s
        """The run's staging (staging_seconds): out of the restart overhead (or a first start's other time)."""
        self._started = sorted((i for i in incs if i.start is not None), key=lambda i: i.start or 0.0)
        self._starts = [i.start or 0.0 for i in self._started]
        self._covered: list[list[int]] = []  # disjoint, sorted [first, last] step ranges of newer records
        self._hist: Counter[float] = Counter()
        self._earliest: dict[int, tuple[JsonObject, float]] = {}  # incarnation -> (its first record, new part)
        self.newest: JsonObject | None = None
        self.oldest: JsonObject | None = None
        self.useful = self.productive = self.stalls = 0.0
        # An in-job restart's first record, until its older neighbour says when the failed step ended.
        self._restarted: tuple[JsonObject, float, int] | None = None
        self._in_job: list[tuple[float, JsonObject, float]] = []  # (gap, first record, its new part)

    def add(self, rec: JsonObject) -> None:
        if "step" not in rec or "time" not in rec:
            return
        self.newest = self.newest or rec
        self.oldest = rec
        n, last, busy = steps_of(rec), int(rec["step"]), busy_s(rec)
        new = 1.0 - self._cover(last - n + 1, last) / n
        self.useful += busy
        self.productive += new * busy
        self.stalls += float(rec.get("ckpt_stall_s", 0.0))
        self._hist[step_bucket(float(rec.get("step_s", 0.0)))] += n
        k = bisect.bisect_right(self._starts, float(rec["time"])) - 1 if self._started else 0
        if self._restarted is not None:
            first, first_new, first_k = self._restarted
            self._restarted = None
            if first_k == k:  # else it was its incarnation's first start, counted as such
                self._in_job.append((max(0.0, float(first["time"]) - busy_s(first) - float(rec["time"])),
                                     first, first_new))
        if "startup" in rec or "warm_restart" in rec:  # the first step of a process, or of a warm restart
            self._restarted = (rec, new, k)
        if k >= 0:  # a step that ended before the first incarnation started belongs to none
            seen = self._earliest.get(k)
            if seen is None or float(rec["time"]) <= float(seen[0]["time"]):
                self._earliest[k] = (rec, new)

    def _cover(self, first: int, last: int) -> int:
        """How many of first..last are covered already; then cover them (merging ranges)."""
        covered = self._covered
        if not covered or last + 1 < covered[0][0]:  # the usual case: the steps just before newer ones
            covered.insert(0, [first, last])
            return 0
        if last + 1 == covered[0][0]:
            covered[0][0] = first
            return 0
        overlap = sum(max(0, min(last, b) - max(first, a) + 1) for a, b in self._covered)
        merged: list[list[int]] = []
        for a, b in sorted([*self._covered, [first, last]]):
            if merged and a <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self._covered = merged
        return overlap

    @property
    def incarnations(self) -> list[Incarnation]:
        """The started incarnations, or the run's own clock where there are none (a local run)."""
        if self._started or self.oldest is None or self.newest is None:
            return self._started
        return [local_incarnation(self.oldest, self.newest)]

    @property
    def typical(self) -> float:
        """The median step time: what a step costs once an incarnation is warm."""
        total, seen = sum(self._hist.values()), 0
        for value in sorted(self._hist):
            seen += self._hist[value]
            if seen > total // 2:
                return value
        return 0.0

    def firsts(self) -> list[tuple[Incarnation, JsonObject]]:
        """Each started incarnation with the first record it wrote (those that wrote none are left out).

        A step belongs to the incarnation that started last before it (sacct's times are whole seconds)."""
        incs = self.incarnations
        return [(incs[k], self._earliest[k][0]) for k in sorted(self._earliest) if k < len(incs)]

    def restart_overheads(self) -> list[float]:
        """For each incarnation after the first: seconds from running again until training is back at speed.

        That is until its first step began, plus what that step took beyond a typical step: the
        first step pays for work deferred to it (torch._dynamo's import, allocator warm-up), and that
        part is restart cost, not training.
        """
        typical, out = self.typical, []
        for inc, rec in self.firsts()[1:]:
            began = float(rec["time"]) - busy_s(rec)
            out.append(max(0.0, began - (inc.start or began)) + max(0.0, busy_s(rec) - typical))
        return out

    def in_job_overheads(self) -> list[float]:
        """For each in-job restart, oldest first: seconds from the end of the last step before it
        until training is back at speed (its first step began, plus that step's excess)."""
        typical = self.typical
        return [gap + max(0.0, busy_s(rec) - typical) for gap, rec, _ in reversed(self._in_job)]

    def _first_steps(self) -> list[tuple[JsonObject, float]]:
        """The first record of every start, incarnation or in-job, with its new part."""
        return [*(self._earliest[k] for k in sorted(self._earliest)), *((rec, new) for _, rec, new in self._in_job)]

    def result(self, now: float | None = None) -> Goodput:
        """Split the wall time of the run into productive and lost time."""
        now = now or time.time()
        started = self.incarnations
        if not started:
            return Goodput(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
        wall = max(max((i.end or now) for i in started) - (started[0].start or 0.0), 1e-9)
        typical, useful, productive = self.typical, self.useful, self.productive
        for rec, new in self._first_steps():
            if steps_of(rec) == 1:  # a first step's warm-up beyond a typical step is restart cost
                excess = max(0.0, busy_s(rec) - typical)
                useful, productive = useful - excess, productive - new * excess
        queue = sum(max(0.0, (b.start or 0.0) - (a.end or b.start or 0.0)) for a, b in zip(started, started[1:],
                                                                                             strict=False))
        restart = sum(self.restart_overheads()) + sum(self.in_job_overheads())
        recomputed = useful - productive
        other = max(wall - productive - recomputed - self.stalls - queue - restart, 0.0)
        # Staging is part of a restart's overhead, or of a first start's (which counts as other).
        staging = min(self.staging_s, restart + other)
        from_restart = min(staging, restart)
        steps = sum(b - a + 1 for a, b in self._covered)
        return Goodput(wall, productive, queue, restart - from_restart, recomputed, self.stalls,
                       other - (staging - from_restart), productive / wall, steps, staging)


def staging_seconds(paths: RunPaths) -> float:
    """The run's staging time (stage.jsonl: one line per node and stage): for each start of the
    job, its slowest node's environment and data, summed over the starts."""
    per_node: dict[tuple[str, int, str], float] = {}
    for rec in iter_records(paths.stage_log):
        key = (str(rec.get("job", "")), int(rec.get("restart_count", 0)), str(rec.get("node", "")))
        per_node[key] = per_node.get(key, 0.0) + float(rec.get("seconds", 0.0))
    starts: dict[tuple[str, int], float] = {}
    for (job, restart, _), seconds in per_node.items():
        starts[(job, restart)] = max(starts.get((job, restart), 0.0), seconds)
    return sum(starts.values())


def of_records(steps: list[JsonObject], incs: list[Incarnation]) -> Accountant:
    """The accountant of records held in a list, oldest first."""
    acc = Accountant(incs)
    for rec in reversed(steps):
        acc.add(rec)
    return acc


def of_file(path: Path, incs: list[Incarnation]) -> Accountant:
    """The accountant of a metrics file, streamed from its end."""
    acc = Accountant(incs)
    for rec in iter_records_reversed(path):
        acc.add(rec)
    return acc


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


def account(steps: list[JsonObject], incs: list[Incarnation], now: float | None = None) -> Goodput:
    """Split the wall time of a run into productive and lost time (records oldest first)."""
    return of_records(steps, incs).result(now)
