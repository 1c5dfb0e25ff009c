"""What Slurm prints, read: pure functions on text, tested on recorded real output (22.05 and 23.x).

slurm/commands.py runs the command and hands its stdout here; nothing here runs anything.
"""

from __future__ import annotations

import datetime as dt
import functools
import gc
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from slurmkit.config.fields import duration_s

# PREEMPTED is an end: a job preempted under PreemptMode=REQUEUE goes RUNNING, COMPLETING, PENDING
# (measured on the dev cluster; PREEMPTED is only its old incarnation's sacct line), while under
# CANCEL it stays PREEMPTED.
ACTIVE_STATES = frozenset(
    {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
     "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "STOPPED", "RESV_DEL_HOLD"}
)

SQUEUE_FORMAT = "%i|%T|%r|%N|%M|%A"
SACCT_FORMAT = "JobID,State,Reason,NodeList,Elapsed,ExitCode,Submit,Start,End"
_PENDING_RANGE_RE = re.compile(r"^(\d+)_\[([\d,\-:.]+)(?:%\d+)?\]$")
_TASK_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


class TruncatedArray(ValueError):
    """squeue cut a pending array's task list short (`123_[2,4,6,...%9]`): its tasks cannot be known
    from that line, so this is an error, never a guess (slurmkit asks for one line per task, --array)."""


def array_tasks(base: str, ranges: str) -> list[str]:
    """A pending array's task ids from squeue's list: `2-18:2,21` -> 2, 4, ..., 18, 21."""
    tasks: list[str] = []
    for item in ranges.split(","):
        m = _TASK_RANGE_RE.match(item)
        if m is None:
            raise TruncatedArray(f"squeue printed job {base}'s pending tasks as [{ranges}]")
        lo, hi, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
        tasks += [f"{base}_{i}" for i in range(lo, hi + 1, step)]
    return tasks


@dataclass(frozen=True, slots=True)
class Incarnation:
    """One run of a job as accounting saw it (a requeued job has several); times are epoch seconds."""

    job_id: str
    submit: float | None
    start: float | None
    end: float | None
    state: str
    nodes: str


@dataclass(slots=True)  # not frozen: a frozen __init__ costs 2x, and status builds 100k of them
class JobInfo:
    job_id: str
    state: str
    reason: str = ""
    nodes: str = ""
    elapsed: str = ""
    exit_code: str = ""
    restarts: int = 0
    source: str = "squeue"
    history: tuple[Incarnation, ...] = ()
    """sacct only: every incarnation, oldest first."""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


@functools.lru_cache(maxsize=4096)  # 100k tasks share few distinct seconds; local-time conversion is the cost
def epoch(text: str) -> float | None:
    """sacct's ISO time as epoch seconds; Unknown (not yet), None or empty: None."""
    if not text or text in ("Unknown", "None"):
        return None
    return dt.datetime.fromisoformat(text).timestamp()


@contextmanager
def _no_gc() -> Iterator[None]:
    """Rows make no reference cycles, but 100k of them trigger ~150 collections of the caller's
    whole heap (a 100k-task manifest is in it): about 40% of a parse. Collect after instead."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def squeue(text: str) -> dict[str, JobInfo]:
    """squeue --noheader --array --format=SQUEUE_FORMAT. A pending array's not yet split tasks may
    still come as one line, 123_[4-999%4] or stepped 123_[2-18:2%9]: each task gets its own entry;
    a list squeue cut short is a TruncatedArray."""
    with _no_gc():
        return _squeue(text)


def _squeue(text: str) -> dict[str, JobInfo]:
    jobs: dict[str, JobInfo] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 6:
            continue
        job_id, state, reason, nodes, elapsed = parts[:5]
        state = state.partition(" ")[0]
        pending = _PENDING_RANGE_RE.match(job_id) if "[" in job_id else None
        if pending is None:
            jobs[job_id] = JobInfo(job_id, state, reason, nodes, elapsed)
            continue
        for jid in array_tasks(pending.group(1), pending.group(2)):
            jobs[jid] = JobInfo(jid, state, reason, nodes, elapsed)
    return jobs


def sacct(text: str) -> dict[str, JobInfo]:
    """sacct --noheader --parsable2 --allocations --duplicates --format=SACCT_FORMAT: one line per
    incarnation, oldest first; the count of earlier ones is the restarts."""
    with _no_gc():
        return _sacct(text)


def _sacct(text: str) -> dict[str, JobInfo]:
    history: dict[str, list[Incarnation]] = {}
    jobs: dict[str, JobInfo] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 9:
            continue
        job_id, state, reason, nodes, elapsed, exit_code, submit, start, end = parts[:9]
        state = state.partition(" ")[0] or "UNKNOWN"  # "CANCELLED by 0" -> CANCELLED
        runs = history.setdefault(job_id, [])
        if runs and runs[-1].state == "RESIZING":
            # A --no-kill job that lost a node goes on as the same incarnation: sacct ends a RESIZING
            # line on the old nodes and starts a new one on the rest (measured, 22.05).
            first = runs.pop()
            elapsed = _add_elapsed(jobs[job_id].elapsed, elapsed)
            began = (first.submit, first.start)
        else:
            began = (epoch(submit), epoch(start))
        runs.append(Incarnation(job_id, *began, epoch(end), state, nodes))
        jobs[job_id] = JobInfo(job_id, state, reason, nodes, elapsed, exit_code, len(runs) - 1, "sacct", tuple(runs))
    return jobs


def _add_elapsed(a: str, b: str) -> str:
    """Two sacct Elapsed values ([D-]HH:MM:SS) added, in sacct's form."""
    try:
        total = int(duration_s(a) + duration_s(b))
    except ValueError:  # one of them empty or odd: the later one is what sacct says now
        return b
    days, rest = divmod(total, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def time_left(text: str) -> float | None:
    """squeue --format=%L: seconds left, or None for UNLIMITED, NOT_SET, INVALID, no line or a line
    that is no duration (unknown: the caller reads the stop signal as a preemption)."""
    value = text.strip()
    if not value or value in ("UNLIMITED", "NOT_SET", "INVALID"):
        return None
    try:
        return float(duration_s(value))
    except (ValueError, KeyError):
        return None


def config(text: str) -> dict[str, str]:
    """scontrol show config: KEY = VALUE lines."""
    conf: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            conf[key.strip()] = value.strip()
    return conf


def oneliner(line: str) -> dict[str, str]:
    """scontrol -o output: space-separated KEY=VALUE pairs."""
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


_UNUSABLE_STATES = ("down", "drain", "drng", "fail", "maint", "unk", "futr", "npc", "boot", "inval")


def unusable_nodes(text: str) -> list[str]:
    """Nodes that cannot run a new step, from `sinfo --Node --format="%N %t"` (one line per node
    and partition): down, drained or draining, failing, in maintenance, or not responding (`*`)."""
    bad = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and (parts[1].endswith("*") or parts[1].rstrip("~#!%$@^-").startswith(_UNUSABLE_STATES)):
            bad.add(parts[0])
    return sorted(bad)


def het_jobs(job_ids: list[str], infos: dict[str, JobInfo]) -> dict[str, JobInfo]:
    """`infos` with each heterogeneous job of `job_ids` as one (squeue and sacct list its components,
    JOB+N): its first component's state and incarnations (the batch step's, which the job's life
    follows), on every component's nodes."""
    for jid in job_ids:
        parts: list[JobInfo] = []
        while f"{jid}+{len(parts)}" in infos:
            parts.append(infos.pop(f"{jid}+{len(parts)}"))
        if not parts:
            continue
        history = tuple(replace(inc, job_id=jid, nodes=",".join(p.history[i].nodes for p in parts
                                                                 if i < len(p.history) and p.history[i].nodes))
                        for i, inc in enumerate(parts[0].history))
        infos[jid] = replace(parts[0], job_id=jid, nodes=",".join(p.nodes for p in parts if p.nodes), history=history)
    return infos
