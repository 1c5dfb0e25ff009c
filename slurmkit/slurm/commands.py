"""Slurm command lines: argument lists, no shell, a timeout each, and one call for many jobs."""

from __future__ import annotations

import getpass
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from slurmkit import trust
from slurmkit.common.slurm_env import base_id, expand_hostlist
from slurmkit.errors import SlurmError, squash, warn
from slurmkit.jsontypes import JsonObject
from slurmkit.slurm import parse

# What Slurm prints is read in slurm/parse.py; callers know ACTIVE_STATES as commands.ACTIVE_STATES.
from slurmkit.slurm.parse import ACTIVE_STATES as ACTIVE_STATES
from slurmkit.slurm.parse import JobInfo

DEFAULT_TIMEOUT_S = 30.0
SBATCH_TIMEOUT_S = 60
SBATCH_KILL_AFTER_S = 5  # an sbatch past its timeout gets SIGTERM, then SIGKILL this much later
IN_GRACE_TIMEOUT_S = 10.0  # a question asked inside a job's grace: an unanswered one must not eat the save's time
# Slurm calls made by this process, by program: bounded (one counter per program), so a long
# --wait or logs --follow does not grow it; tests and benchmarks read it through counting().
CALLS: Counter[str] = Counter()


@contextmanager
def counting() -> Iterator[Counter[str]]:
    """The Slurm calls made inside the block, by program (filled in when the block ends)."""
    before = CALLS.copy()
    made: Counter[str] = Counter()
    try:
        yield made
    finally:
        made.update(CALLS - before)


# A query that meets one of these (or its timeout) is asked again: slurmctld restarting, failing
# over or too busy answers so for seconds. Commands that change state are never repeated here.
# "Unexpected message received": a slurmctld thawed after SIGSTOP answered the first call after its
# backlog so, and had acted on it (the in-job requeue went through).
_TRANSIENT_RE = re.compile(r"unable to contact slurm controller|socket timed out|connection (refused|timed out)|"
                           r"resource temporarily unavailable|transport endpoint|slurm_load_\w+ error|"
                           r"unexpected message received", re.IGNORECASE)
QUERY_ATTEMPTS = 3
# Seconds before the second and third attempt: exponential from 1 s, jittered so that many
# waiting clients do not come back to a restarted controller in the same second.
QUERY_WAIT = {"multiplier": 1.0, "max": 8.0, "jitter": 1.0}


class TransientSlurmError(SlurmError):
    """A timeout, or a controller that cannot be reached right now: a query is asked again."""


class SlurmTimeout(TransientSlurmError):
    """A Slurm command that did not answer within its timeout."""


def call(argv: list[str], timeout: float = DEFAULT_TIMEOUT_S,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command (an argument list, never a shell string) within `timeout`; every
    Slurm call slurmkit makes comes through here (submitit's own sbatch runs under coreutils
    timeout, slurm/submitit_executor.py)."""
    CALLS[argv[0]] += 1
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"{argv[0]} not found on PATH", valid="is Slurm installed on this node?")
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except subprocess.TimeoutExpired as exc:
        raise SlurmTimeout(f"{argv[0]} did not answer within {timeout:.0f} s", valid="is slurmctld up?") from exc


def _failed(what: str, proc: subprocess.CompletedProcess[str]) -> str:
    """One line for a Slurm command that exited non-zero: what it was, and what it said."""
    return f"{what} failed: {squash(proc.stderr or proc.stdout, None) or f'exit code {proc.returncode}'}"


def _once(argv: list[str], timeout: float, check: bool) -> str:
    proc = call(argv, timeout)
    if check and proc.returncode != 0:
        transient = _TRANSIENT_RE.search(proc.stderr or "")
        raise (TransientSlurmError if transient else SlurmError)(_failed(" ".join(argv[:2]), proc))
    return proc.stdout


def run(argv: list[str], *, timeout: float = DEFAULT_TIMEOUT_S, check: bool = True, query: bool = False) -> str:
    """Run one Slurm command and return its stdout; failures become one-line SlurmErrors. A query
    (it changes nothing) is asked up to QUERY_ATTEMPTS times while it meets a timeout or a
    transient controller error, so a controller hiccup of a few seconds is not an error."""
    if not query:
        return _once(argv, timeout, check)
    import tenacity

    retrying = tenacity.Retrying(stop=tenacity.stop_after_attempt(QUERY_ATTEMPTS),
                                 wait=tenacity.wait_exponential(multiplier=QUERY_WAIT["multiplier"],
                                                                max=QUERY_WAIT["max"])
                                 + tenacity.wait_random(0, QUERY_WAIT["jitter"]),
                                 retry=tenacity.retry_if_exception_type(TransientSlurmError), reraise=True)
    return str(retrying(_once, argv, timeout, check))


def _ids(job_ids: list[str]) -> list[str]:
    """Every id a Slurm job id (trust.job_id), before it reaches a command: never an option."""
    return [trust.job_id(j, "job id") for j in job_ids]


def squeue_all() -> dict[str, JobInfo]:
    """One squeue call for every job of this user, array tasks expanded (--array: one line per task,
    where squeue alone prints a pending array as `123_[2-18:2%9]`, cut short past about 64 characters).
    Slurm 22.05 leaves the last task of a stepped pending array out even so: sweeps.results counts a
    task that never started, of an array with tasks pending, as pending."""
    argv = ["squeue", "--me", "--noheader", "--array", "--states=all", f"--format={parse.SQUEUE_FORMAT}"]
    text = run(argv, query=True)
    try:
        return parse.squeue(text)
    except parse.TruncatedArray as exc:  # a pending array not expanded, and cut: never guess its tasks
        raise SlurmError(str(exc), where="squeue", valid="squeue did not expand the array (--array)") from exc


def jobs_by_script(names: list[str], since: str) -> dict[str, str]:
    """The job id of each of this user's jobs (pending, running or ended since `since`) whose batch
    script's file name is one of `names`: squeue's command for jobs slurmctld still holds, sacct's
    submit line for the rest. How a job is found whose submitter died before it wrote sbatch's answer."""
    queued = run(["squeue", "--me", "--noheader", "--states=all", "--format=%F|%o"], query=True)
    try:
        ended = run(["sacct", "--noheader", "--parsable2", "--allocations", f"--user={getpass.getuser()}",
                     f"--starttime={since}", "--format=JobID,SubmitLine"], query=True)
    except SlurmError as exc:  # no accounting: squeue still holds a job for MinJobAge after it ends
        _sacct_failed(exc, "only the jobs slurmctld still holds are looked at")
        ended = ""
    found: dict[str, str] = {}
    for line in [*queued.splitlines(), *ended.splitlines()]:
        job, _, command = line.partition("|")
        words = {Path(w).name for w in command.split()}
        for name in names:
            if name in words:
                found.setdefault(name, base_id(job.strip()))
    return found


def sacct(job_ids: list[str]) -> dict[str, JobInfo]:
    """One sacct call for finished jobs: allocation lines only, one per job or array task, with every
    incarnation (--duplicates lists requeued ones, oldest first: their count is the restarts)."""
    if not job_ids:
        return {}
    text = run(["sacct", "--noheader", "--parsable2", "--allocations", "--duplicates", "--jobs",
                ",".join(_ids(job_ids)), f"--format={parse.SACCT_FORMAT}"], query=True)
    return parse.het_jobs(job_ids, parse.sacct(text))


def sacct_or_warn(job_ids: list[str]) -> dict[str, JobInfo]:
    """sacct, where a failure (no slurmdbd, a timeout, accounting disabled) is one warning on stderr
    and no answer: a status or a wait goes on from squeue and the run folders, never exit 3."""
    try:
        return sacct(job_ids)
    except SlurmError as exc:
        _sacct_failed(exc, "finished jobs are judged by their run folders")
        return {}


def _sacct_failed(exc: SlurmError, meaning: str) -> None:
    """One warning per failure per process: a --wait or a recovery asks again and again."""
    if exc.what not in _SACCT_WARNED:
        _SACCT_WARNED.add(exc.what)
        warn(f"sacct failed, {meaning}: {exc.what}")


_SACCT_WARNED: set[str] = set()


def job_states(job_ids: list[str]) -> dict[str, JobInfo]:
    """States of many jobs: one squeue call, plus one sacct call for those squeue no longer knows."""
    live = parse.het_jobs(job_ids, squeue_all())
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
        acct = sacct_or_warn(missing + ended)
        found.update((jid, replace(found[jid], history=acct[jid].history)) for jid in ended if jid in acct)
        found.update((jid, info) for jid, info in acct.items() if jid not in found)
    return found


def scancel(job_ids: list[str], signal: str | None = None, steps_only: bool = False) -> None:
    """Cancel, or with `signal` signal every process of the job (the batch shell too, unless
    steps_only: Slurm 22.05 then delivers a signal it knows only by number to the steps' tasks,
    which --full does not)."""
    argv = ["scancel"]
    if signal:
        argv += ([] if steps_only else ["--full"]) + [f"--signal={signal}"]
    run(argv + _ids(job_ids))


class RequeueUncertain(SlurmError):
    """A requeue whose tries failed after one timed out: it may have gone through, or may not."""


def requeue(job_id: str, within_s: float = 0.0) -> None:
    """Ask Slurm to requeue a job. From inside the job (the supervisor, rank 0) a controller hiccup
    is retried for `within_s`, the grace the job has left: a job that ends before its requeue went
    through does not come back. A retry that finds the job already requeued ("pending execution")
    means an earlier try went through.

    A try that timed out may still go through: slurmctld reads the request once it answers again
    (seen with slurmctld stopped by SIGSTOP). If no later try settles it, RequeueUncertain says so."""
    argv = ["scontrol", "requeue", *_ids([job_id])]
    if within_s <= 0:
        run(argv)
        return
    import tenacity

    sent = False  # an earlier try may have reached slurmctld

    def once() -> None:
        nonlocal sent
        try:
            _once(argv, min(DEFAULT_TIMEOUT_S, max(2.0, within_s / 3)), check=True)
        except TransientSlurmError:
            sent = True
            raise
        except SlurmError as exc:
            if not sent or "pending execution" not in exc.what.lower():
                raise

    try:
        tenacity.Retrying(stop=tenacity.stop_after_delay(within_s),
                          wait=tenacity.wait_exponential(multiplier=0.5, max=4.0) + tenacity.wait_random(0, 0.5),
                          retry=tenacity.retry_if_exception_type(TransientSlurmError), reraise=True)(once)
    except SlurmError as exc:
        if sent:
            raise RequeueUncertain(f"{exc.what} (an earlier try may still go through)", valid=exc.valid) from exc
        raise


@dataclass(frozen=True)
class Preemption:
    """Slurm has picked a running job for preemption (scontrol's PreemptTime)."""

    at: str
    """When Slurm picked it (PreemptTime)."""
    mode: str
    """Its partition's PreemptMode: REQUEUE, CANCEL, ..."""
    ends: str
    """When the grace ends and Slurm stops the job itself (EndTime)."""

    @property
    def left_s(self) -> float:
        """Seconds of grace left (0 if unknown or over)."""
        import datetime as dt

        try:
            return max(0.0, dt.datetime.fromisoformat(self.ends).timestamp() - dt.datetime.now().timestamp())
        except ValueError:
            return 0.0

    @property
    def requeues(self) -> bool:
        """Under CANCEL the preempted job does not come back; under REQUEUE it must ask in time."""
        return "CANCEL" not in self.mode.upper()


def preemption(job_id: str) -> Preemption | None:
    """Whether Slurm is preempting this job, and its partition's mode; None if not (or unknown).
    Asked once each, not retried: this runs inside the grace period."""
    job = _show_job(job_id, check=False)
    at = job.get("PreemptTime", "None")
    if at in ("", "None", "Unknown"):
        return None
    part = parse.oneliner(run(["scontrol", "--oneliner", "show", "partition", job.get("Partition", "")],
                              timeout=IN_GRACE_TIMEOUT_S, check=False))
    return Preemption(at=at, mode=part.get("PreemptMode", "") or "UNKNOWN", ends=job.get("EndTime", ""))


def sbatch(script: str, options: list[str], env: dict[str, str], timeout: float = SBATCH_TIMEOUT_S) -> str:
    """Submit one batch script file; its job id. Never retried: a submit that timed out may have queued."""
    proc = call(["sbatch", "--parsable", *options, script], timeout, env)
    if proc.returncode != 0:
        raise SlurmError(_failed("sbatch", proc))
    return proc.stdout.strip().split(";")[0]


def exclude_nodes(job_id: str, nodes: list[str]) -> None:
    """Keep a (pending, requeued) job off these nodes."""
    run(["scontrol", "update", f"JobId={_ids([job_id])[0]}", f"ExcNodeList={','.join(nodes)}"])


def version() -> str:
    return run(["scontrol", "--version"], check=False).strip()


def srun_probe(options: list[str], command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """One task that runs `bash -c command` on a compute node: its exit status and output."""
    return call(["srun", *options, "bash", "-c", command], timeout)


def srun_help() -> str:
    return run(["srun", "--help"], timeout=20, check=False)


def time_left_s(job_id: str) -> float | None:
    """Seconds before the job's time limit (squeue %L), None when unlimited or unknown. Asked once:
    it is asked at stop time, inside the grace period, where a retry's wait would eat the save."""
    return parse.time_left(run(["squeue", "--noheader", "--jobs", *_ids([job_id]), "--format=%L"],
                               timeout=IN_GRACE_TIMEOUT_S, check=False))


def job_nodes(job_id: str) -> list[str]:
    """The nodes a running job holds now (scontrol's NodeList): a --no-kill job that lost a node
    holds fewer than its SLURM_JOB_NODELIST. Asked once, by the supervisor between two steps."""
    nodes = _show_job(job_id, check=True).get("NodeList", "")
    return expand_hostlist(nodes) if nodes and nodes != "(null)" else []


def _show_job(job_id: str, check: bool) -> dict[str, str]:
    """One job's fields from `scontrol --oneliner show job`, asked once within IN_GRACE_TIMEOUT_S."""
    lines = run(["scontrol", "--oneliner", "show", "job", *_ids([job_id])], timeout=IN_GRACE_TIMEOUT_S,
                check=check).splitlines()
    return parse.oneliner(lines[0]) if lines else {}


def unusable_nodes(nodelist: str) -> list[str]:
    """The nodes of `nodelist` that cannot run a new step now (slurm.parse.unusable_nodes). Asked
    once, by the supervisor between two steps: a controller that does not answer is an error."""
    return parse.unusable_nodes(run(["sinfo", "--noheader", "--Node", "--nodes", nodelist, "--format=%N %t"],
                                    timeout=IN_GRACE_TIMEOUT_S))


def incarnation_states(job_id: str) -> list[str]:
    """State of every incarnation of a job, oldest first; [] when accounting cannot say."""
    try:
        info = sacct([job_id]).get(job_id)
    except SlurmError:
        return []
    return [i.state for i in info.history] if info else []


def process_state(job_id: str, host: str, pid: int) -> str:
    """The state letter of process `pid` on `host` (/proc/PID/stat: R, S, D, T, ...), read by one srun
    step beside the job's own (--overlap); "" where there is no such process."""
    stat = run(["srun", "--overlap", f"--jobid={_ids([job_id])[0]}", "-w", host, "-N1", "-n1", "cat",
                f"/proc/{int(pid)}/stat"], timeout=30, check=False)
    return stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else ""  # the field after the command's name


def show_config() -> dict[str, str]:
    return parse.config(run(["scontrol", "show", "config"], query=True))


def cluster_name() -> str:
    """Slurm's ClusterName: whose node ledger a submit reads (common.node_ledger)."""
    return show_config().get("ClusterName", "")


def show_partitions() -> dict[str, dict[str, str]]:
    out = run(["scontrol", "show", "partition", "--oneliner"], query=True)
    parts = [parse.oneliner(line) for line in out.splitlines() if line.strip()]
    return {p["PartitionName"]: p for p in parts if "PartitionName" in p}


def partition_gres(partition: str) -> list[str]:
    out = run(["sinfo", "--noheader", "--partition", partition, "--format=%G"], query=True)
    return [g for line in out.splitlines() for g in line.strip().split(",") if g and g != "(null)"]


def ping() -> JsonObject:
    out = run(["scontrol", "ping"], timeout=10, check=False)
    return {"up": "UP" in out, "detail": squash(out, None)}
