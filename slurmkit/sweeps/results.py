"""Sweep status (one squeue call, at most one sacct, whatever the task count) and the results table."""

from __future__ import annotations

import csv
import io
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from slurmkit.common.atomic import write_output
from slurmkit.common.metrics import is_number, last_record, last_values
from slurmkit.common.record import RunFile
from slurmkit.common.sweep_layout import (
    ArrayLog,
    DriverFile,
    Manifest,
    SweepManifest,
    SweepPaths,
    latest_job_ids,
    newest_arrays,
    task_entry,
)
from slurmkit.config.profile import Resources
from slurmkit.errors import SlurmkitError, did_you_mean
from slurmkit.insight import cost
from slurmkit.jsontypes import JsonObject
from slurmkit.runs.jobs import is_active, local_state
from slurmkit.runs.polling import Poller
from slurmkit.runs.procs import same_process
from slurmkit.slurm import commands
from slurmkit.slurm.commands import TransientSlurmError

NOT_SUBMITTED = "NOT_SUBMITTED"
PRUNED = "PRUNED"
FAILED = "FAILED"
DEFAULT_METRIC = "loss"
RESULT = "result"
_MINIMIZE_RE = re.compile(r"loss|err|perplexity|ppl|time|latency|_s$")


@dataclass(frozen=True)
class TaskState:
    index: int
    state: str
    job_id: str
    nodes: str = ""
    elapsed: str = ""
    restarts: int = 0
    node_hours: float = 0.0
    """What the task's newest job held, once it has ended (slurmkit.insight.cost); 0 before."""
    gpu_hours: float = 0.0

    def as_dict(self) -> JsonObject:
        return asdict(self)


def _local_states(paths: SweepPaths, manifest: SweepManifest) -> list[TaskState]:
    latest = latest_job_ids(manifest)
    out = []
    for index, arr in newest_arrays(manifest).items():
        jid = latest[index]
        if jid:
            task = paths.task(index)
            state = local_state(task, RunFile(task).read()) if task.record.exists() else "PENDING"
        else:
            runner = (arr.runner_pid, arr.runner_start) if arr else (None, None)
            state = "PENDING" if same_process(*runner) else NOT_SUBMITTED
        out.append(TaskState(index, state, jid or ""))
    return out


def _by_outcomes(paths: SweepPaths, manifest: SweepManifest, index: int, job_id: str,
                 pending_arrays: set[str]) -> str:
    """A task neither squeue nor sacct knows: what its ranks' outcome records say (RunPaths.outcome_state).
    One that never started, of an array with tasks still pending, is pending too: Slurm 22.05's
    `squeue --array` leaves out the last task of a pending array it holds in stepped form (submitted
    `--array=1,3,...,39`, shown `_[1-39:2]`, listed 1..37; measured on the dev cluster)."""
    task = paths.task(index)
    if not task.record.exists():
        return "PENDING" if commands.base_id(job_id) in pending_arrays else "UNKNOWN"
    return task.outcome_state(job_id, task_entry(paths, manifest, index).num_tasks)


def task_states(paths: SweepPaths, manifest: SweepManifest | None = None) -> list[TaskState]:
    """Every task's state: the newest job of each task, from one squeue and (if needed) one sacct;
    a search's trial that its pruner stopped, once ended, is PRUNED."""
    manifest = manifest or Manifest(paths).read()
    states = _local_states(paths, manifest) if manifest.executor == "local" else _slurm_states(paths, manifest)
    # A search's trial whose params the spec refused never ran: it failed (ManifestTask.invalid).
    states = [replace(s, state=FAILED) if manifest.tasks[s.index].invalid else s for s in states]
    if manifest.search is not None and paths.driver.exists():
        pruned = DriverFile(paths).read().pruned
        states = [replace(s, state=PRUNED) if str(s.index) in pruned and not is_active(s.state) else s for s in states]
    return states


def _slurm_states(paths: SweepPaths, manifest: SweepManifest) -> list[TaskState]:
    latest = latest_job_ids(manifest)
    if not any(latest.values()):
        return [TaskState(i, NOT_SUBMITTED, "") for i in latest]
    live = commands.squeue_all()
    # sacct on an array's base id lists all of its tasks: one call covers every finished task.
    # A task squeue still shows as ended (MinJobAge) is asked of sacct too: its history is the cost's.
    finished_arrays = sorted({commands.base_id(j) for j in latest.values() if j and (j not in live or
                                                                                    not live[j].active)})
    done = commands.sacct_or_warn(finished_arrays) if finished_arrays else {}
    pending = {commands.base_id(j) for j, info in live.items() if info.state == "PENDING"}
    out = []
    for index, jid in latest.items():
        info = (done.get(jid) or live.get(jid)) if jid else None
        if info is None:
            out.append(TaskState(index, _by_outcomes(paths, manifest, index, jid, pending) if jid else NOT_SUBMITTED,
                                 jid or ""))
        else:
            gpus = cost.gpus_per_node(Resources.model_validate(manifest.groups[manifest.tasks[index].group].resources))
            ended = info.history and not info.active
            spent = cost.of_run(list(info.history), gpus, 0.0) if ended else cost.Cost(0.0, 0.0, 0.0)
            out.append(TaskState(index, info.state, jid or "", info.nodes, info.elapsed, info.restarts,
                                 round(spent.node_hours, 4), round(spent.gpu_hours, 4)))
    return out


def total_cost(states: list[TaskState]) -> dict[str, float]:
    """The sweep's node-hours and GPU-hours: its ended tasks' summed."""
    return {"node_hours": round(sum(s.node_hours for s in states), 4),
            "gpu_hours": round(sum(s.gpu_hours for s in states), 4)}


def wait(paths: SweepPaths, poll_s: float = 2.0, timeout_s: float | None = None,
         poller: Poller | None = None, on_answer: Callable[[list[TaskState]], None] | None = None
         ) -> list[TaskState]:
    """Poll until no task is active (or timeout_s passes): one squeue and at most one sacct a
    poll, backing off as jobs.wait does. The manifest is read once; the array log every poll,
    so tasks resubmitted meanwhile are waited for too."""
    manifest = Manifest(paths).read()
    return (poller or Poller(first_s=poll_s)).until_ended(
        lambda: task_states(paths, manifest.model_copy(update={"arrays": ArrayLog(paths).read().arrays})),
        lambda states: {s.state for s in states if is_active(s.state)}, timeout_s, on_answer,
        survive=(TransientSlurmError,))


def describe(states: list[TaskState]) -> str:
    """A sweep's transition line: its counts by state, e.g. 2 COMPLETED, 2 RUNNING, 4 PENDING."""
    return ", ".join(f"{n} {state}" for state, n in counts(states).items())


def counts(states: list[TaskState]) -> dict[str, int]:
    return dict(sorted(Counter(s.state for s in states).items()))


def _numbers(mapping: JsonObject) -> dict[str, float | int]:
    return {k: v for k, v in mapping.items() if is_number(v)}


def final_metrics(paths: SweepPaths, index: int, job_id: str, bare: str = RESULT) -> dict[str, float | int]:
    """The newest value of each number the task's own code logged (logged.jsonl: a command's
    slurmkit.tracking.log, Lightning's and HF's metrics), with rank 0's returned numbers (a train
    task's summary, a command's returncode; one number returned is named `bare`, a search's metric
    or `result`) over them, or else the last metrics.jsonl record's."""
    task = paths.task(index)
    outcome = task.outcome(job_id, 0) if job_id else None
    value = outcome.value if outcome is not None and outcome.ok else None
    # A function that returns one number (a search's objective) reports it as `bare`.
    returned = value if isinstance(value, dict) else {bare: value} if is_number(value) else None
    last = returned if returned is not None else last_record(task.metrics) or {}
    return {**last_values(task.logged), **_numbers(last)}


def minimize(metric: str) -> bool:
    return bool(_MINIMIZE_RE.search(metric))


@dataclass(frozen=True)
class Results:
    rows: list[JsonObject]
    varying: list[str]
    metrics: list[str]
    sort: str | None
    best: int | None
    """Index (task index) of the best row by `sort` (or loss), None when no row has it."""


def iter_rows(paths: SweepPaths, manifest: SweepManifest | None = None) -> Iterator[JsonObject]:
    """One row per task, in task order, made as it is yielded: index, state, the varying config
    keys and the task's final metrics. Only tasks that have started have a folder, and so
    metrics: one listing of tasks/ finds them, rather than a failed open per pending task."""
    manifest = manifest or Manifest(paths).read()
    states = task_states(paths, manifest)
    bare = manifest.search.metric if manifest.search is not None else RESULT
    started = set(os.listdir(paths.tasks_dir)) if paths.tasks_dir.is_dir() else set()
    for task, st in zip(manifest.tasks, states, strict=True):
        row = {"index": task.index, "state": st.state, **{k: task.overrides.get(k) for k in manifest.varying}}
        if str(task.index) in started:
            row.update(final_metrics(paths, task.index, st.job_id, bare))
        yield row


def results(paths: SweepPaths, sort: str | None = None, maximize: bool | None = None) -> Results:
    """Every row (iter_rows), the metrics seen, and the best row by `sort` (or loss; a search's
    rows are sorted by its metric, in its mode, unless `sort` names another)."""
    manifest = Manifest(paths).read()
    search = manifest.search
    rows = list(iter_rows(paths, manifest))
    fixed = {"index", "state", *manifest.varying}
    metrics = list(dict.fromkeys(k for r in rows for k in r if k not in fixed))
    if sort is not None and sort not in metrics:
        raise SlurmkitError(f"unknown metric '{sort}'{did_you_mean(sort, metrics)}", where="--sort",
                            valid=f"valid: {', '.join(metrics) or 'none yet (no task has finished)'}")
    default = search.metric if search is not None else DEFAULT_METRIC
    key = sort or (default if default in metrics else None)
    best = None
    if key is not None:
        by_mode = search.mode == "max" if search is not None and key == search.metric else not minimize(key)
        largest = maximize if maximize is not None else by_mode
        # A NaN or infinite value ranks nowhere: it is neither best nor worst, and sorts after the numbers.
        ranked = sorted((r for r in rows if _finite(r.get(key))), key=lambda r: r[key], reverse=largest)
        best = ranked[0]["index"] if ranked else None
        if sort is not None or search is not None:
            rows = ranked + [r for r in rows if not _finite(r.get(key))]
    return Results(rows, manifest.varying, metrics, key, best)


def _finite(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def to_csv(table: Results) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, ["index", "state", *table.varying, *table.metrics])
    writer.writeheader()
    writer.writerows(table.rows)
    return buf.getvalue()


def write_csv(table: Results, path: str) -> None:
    from pathlib import Path

    write_output(Path(path), to_csv(table).encode())
