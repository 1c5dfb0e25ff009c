"""Slurm command lines: argument lists, no shell, a timeout each, and one call for many jobs."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from slurmkit.errors import SlurmError, squash

DEFAULT_TIMEOUT_S = 30.0
# Slurm calls made by this process, by program: bounded (one counter per program), so a long
# --wait or logs --follow does not grow it; tests and benchmarks read it through counting().
CALLS: Counter[str] = Counter()

ACTIVE_STATES = frozenset(
    {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
     "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "PREEMPTED", "STOPPED", "RESV_DEL_HOLD"}
)


@contextmanager
def counting() -> Iterator[Counter[str]]:
    """The Slurm calls made inside the block, by program (filled in when the block ends)."""
    before = CALLS.copy()
    made: Counter[str] = Counter()
    try:
        yield made
    finally:
        made.update(CALLS - before)


def call(argv: list[str], timeout: float = DEFAULT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command (an argument list, never a shell string) within `timeout`; every
    Slurm call slurmkit makes comes through here."""
    CALLS[argv[0]] += 1
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"{argv[0]} not found on PATH", valid="is Slurm installed on this node?")
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"{argv[0]} did not answer within {timeout:.0f} s", valid="is slurmctld up?") from exc


def run(argv: list[str], *, timeout: float = DEFAULT_TIMEOUT_S, check: bool = True) -> str:
    """Run one Slurm command and return its stdout; failures become one-line SlurmErrors."""
    proc = call(argv, timeout)
    if check and proc.returncode != 0:
        detail = squash(proc.stderr or proc.stdout, None) or f"exit code {proc.returncode}"
        raise SlurmError(f"{' '.join(argv[:2])} failed: {detail}")
    return proc.stdout


@dataclass(frozen=True)
class Incarnation:
    """One run of a job as accounting saw it (a requeued job has several); times are epoch seconds."""

    job_id: str
    submit: float | None
    start: float | None
    end: float | None
    state: str
    nodes: str


def _epoch(text: str) -> float | None:
    if not text or text in ("Unknown", "None"):
        return None
    import datetime as dt

    return dt.datetime.fromisoformat(text).timestamp()


@dataclass(frozen=True)
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


def base_id(job_id: str) -> str:
    return job_id.split("_", 1)[0].split(".", 1)[0]


def squeue_all() -> dict[str, JobInfo]:
    """One squeue call for every job of this user, array tasks expanded."""
    out = run(["squeue", "--me", "--noheader", "--array", "--states=all", "--format=%i|%T|%r|%N|%M|%A"])
    jobs: dict[str, JobInfo] = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 6:
            continue
        job_id, state, reason, nodes, elapsed, _ = parts[:6]
        jobs[job_id] = JobInfo(job_id, state.split()[0], reason, nodes, elapsed)
    return jobs


def sacct(job_ids: list[str]) -> dict[str, JobInfo]:
    """One sacct call for finished jobs: allocation lines only, one per job or array task, with every
    incarnation (--duplicates lists requeued ones, oldest first: their count is the restarts)."""
    if not job_ids:
        return {}
    out = run(
        ["sacct", "--noheader", "--parsable2", "--allocations", "--duplicates", "--jobs", ",".join(job_ids),
         "--format=JobID,State,Reason,NodeList,Elapsed,ExitCode,Submit,Start,End"]
    )
    history: dict[str, list[Incarnation]] = {}
    jobs: dict[str, JobInfo] = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) < 9:
            continue
        job_id, state, reason, nodes, elapsed, exit_code, submit, start, end = parts[:9]
        state = state.split()[0]
        history.setdefault(job_id, []).append(
            Incarnation(job_id, _epoch(submit), _epoch(start), _epoch(end), state, nodes))
        jobs[job_id] = JobInfo(job_id, state, reason, nodes, elapsed, exit_code, len(history[job_id]) - 1, "sacct",
                               tuple(history[job_id]))
    return jobs


def job_states(job_ids: list[str]) -> dict[str, JobInfo]:
    """States of many jobs: one squeue call, plus one sacct call for those squeue no longer knows."""
    live = squeue_all()
    by_base: dict[str, list[JobInfo]] = {}
    for info in live.values():
        by_base.setdefault(base_id(info.job_id), []).append(info)
    found: dict[str, JobInfo] = {}
    missing: list[str] = []
    for jid in job_ids:
        # An array's base id stands for all of its tasks.
        tasks = [live[jid]] if jid in live else by_base.get(jid, [])
        if tasks:
            found.update((t.job_id, t) for t in tasks)
        else:
            missing.append(jid)
    # Jobs squeue still shows as ended get their accounting history too (times for goodput), in the same call.
    ended = [jid for jid in job_ids if jid in live and not live[jid].active]
    if missing or ended:
        acct = sacct(missing + ended)
        found.update((jid, replace(found[jid], history=acct[jid].history)) for jid in ended if jid in acct)
        found.update((jid, info) for jid, info in acct.items() if jid not in found)
    return found


def scancel(job_ids: list[str], signal: str | None = None) -> None:
    argv = ["scancel"]
    if signal:
        argv += ["--full", f"--signal={signal}"]
    run(argv + job_ids)


def requeue(job_id: str) -> None:
    run(["scontrol", "requeue", job_id])


def exclude_nodes(job_id: str, nodes: list[str]) -> None:
    """Keep a (pending, requeued) job off these nodes."""
    run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}"])


def version() -> str:
    return run(["scontrol", "--version"], check=False).strip()


def srun_probe(options: list[str], command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """One task that runs `bash -c command` on a compute node: its exit status and output."""
    return call(["srun", *options, "bash", "-c", command], timeout)


def srun_help() -> str:
    return run(["srun", "--help"], timeout=20, check=False)


def time_left_s(job_id: str) -> float | None:
    """Seconds before the job's time limit (squeue %L), None when unlimited or unknown."""
    out = run(["squeue", "--noheader", "--jobs", job_id, "--format=%L"], check=False).strip()
    if not out or out in ("UNLIMITED", "NOT_SET", "INVALID"):
        return None
    from slurmkit.config.fields import duration_s

    return float(duration_s(out))


def incarnation_states(job_id: str) -> list[str]:
    """State of every incarnation of a job, oldest first; [] when accounting cannot say."""
    try:
        info = sacct([job_id]).get(job_id)
    except SlurmError:
        return []
    return [i.state for i in info.history] if info else []


def show_config() -> dict[str, str]:
    out = run(["scontrol", "show", "config"])
    conf: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            conf[key.strip()] = value.strip()
    return conf


def parse_oneliner(line: str) -> dict[str, str]:
    """scontrol -o output: space-separated KEY=VALUE pairs."""
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def show_partitions() -> dict[str, dict[str, str]]:
    out = run(["scontrol", "show", "partition", "--oneliner"])
    parts = [parse_oneliner(line) for line in out.splitlines() if line.strip()]
    return {p["PartitionName"]: p for p in parts if "PartitionName" in p}


def partition_gres(partition: str) -> list[str]:
    out = run(["sinfo", "--noheader", "--partition", partition, "--format=%G"])
    return [g for line in out.splitlines() for g in line.strip().split(",") if g and g != "(null)"]


def ping() -> dict[str, Any]:
    out = run(["scontrol", "ping"], timeout=10, check=False)
    return {"up": "UP" in out, "detail": squash(out, None)}
