"""A run's status, read only: its Slurm (or local) state, restarts, accounting and failure, for one
run or many with one squeue call; waiting on it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import Stragglers
from slurmkit.common.metrics import iter_records
from slurmkit.common.record import RunFile, RunRecord
from slurmkit.errors import SlurmkitError
from slurmkit.insight import cost, goodput
from slurmkit.jsontypes import JsonObject
from slurmkit.runs import procs
from slurmkit.runs.failure import headline
from slurmkit.runs.lookup import Scope, find_in, list_runs, read_records
from slurmkit.runs.polling import Poller
from slurmkit.slurm import commands

FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"})
"""Ended states a rank's error explains (`status` shows its cause); TIMEOUT and CANCELLED say theirs."""


@dataclass(frozen=True)
class RunStatus:
    run_id: str
    name: str
    job_id: str
    state: str
    nodes: str
    elapsed: str
    restarts: int
    jobs: int
    run_dir: str
    created: str
    goodput: float | None = None
    """Productive step time / wall time, once the run has ended on Slurm (see slurmkit.insight.goodput)."""
    node_hours: float | None = None
    """What the last job cost, every incarnation summed, once it has ended on Slurm (slurmkit.insight.cost)."""
    gpu_hours: float | None = None
    lost_node_hours: float | None = None
    """Of node_hours, those not spent on steps that count (start-up, restarts, steps run again, stalls)."""
    snapshot: JsonObject | None = None
    """The code snapshot the run runs from (slurmkit.runs.snapshot), if it took one."""
    reason: str = ""
    """Why a pending job waits, as squeue says it (Priority, Resources, BeginTime, JobHeldUser, ...)."""
    cause: str = ""
    """A failed run's failing rank and its error (runs.failure): `rank 1: ValueError: bad input`."""
    executor: str = "slurm"
    """slurm: job_id is a Slurm job id; local: it is the process id of the run's controller."""
    accounting: JsonObject = field(default_factory=dict)
    """An ended Slurm run's whole goodput and cost accounting (goodput, node_hours, ... are of it)."""
    stragglers: list[JsonObject] = field(default_factory=list)
    """A running run's ranks named stragglers now (worker.ft.straggler): rank, node, score, since (ISO)."""
    parts: list[JsonObject] = field(default_factory=list)
    """A heterogeneous run's parts (spec components), by name: name, state, ranks, its in-job
    restarts (this incarnation's), its run folder."""

    @property
    def job_label(self) -> str:
        """The job id as a person reads it: a local run's says it is a process id."""
        return f"pid {self.job_id}" if self.executor == "local" and self.job_id else self.job_id

    def as_dict(self) -> JsonObject:
        return asdict(self)


def local_state(paths: RunPaths, record: RunRecord) -> str:
    """A local run's state from its controller (pid and start time) and its ranks' outcome records."""
    job_id = record.job_ids[-1] if record.job_ids else ""
    if procs.same_process(job_id, record.pid_starts.get(job_id)):
        return "RUNNING"
    return "COMPLETED" if paths.outcome_state(job_id, record.num_tasks) == "COMPLETED" else "FAILED"


def statuses(runs: list[tuple[RunPaths, RunRecord]]) -> list[RunStatus]:
    """Status of many runs with one squeue call (and one sacct call for finished jobs), made only
    when a Slurm run is among them (a local profile's scope holds none).

    Each run's folder is where its run.json was found; the run_dir written inside is not trusted.
    """
    slurm_ids = [r.job_ids[-1] for _, r in runs if r.job_ids and r.executor == "slurm"]
    infos = commands.job_states(slurm_ids) if slurm_ids else {}
    out: list[RunStatus] = []
    for paths, rec in runs:
        jid = rec.job_ids[-1] if rec.job_ids else ""
        state, nodes, elapsed = "NOT_SUBMITTED", "", ""
        if jid and rec.executor == "local":
            state = local_state(paths, rec)
        elif jid:
            info = infos.get(jid)
            state = info.state if info else paths.outcome_state(jid, rec.num_tasks)
            nodes, elapsed = (info.nodes, info.elapsed) if info else ("", "")
            if not is_active(state) and rec.preempted is not None and rec.preempted.job_id == jid:
                state = "PREEMPTED"  # it saved and exited within GraceTime, so Slurm says COMPLETED
        # run.json knows every restart and its cause, whichever incarnation is live now.
        restarts = max(len(rec.restarts), infos[jid].restarts if jid in infos else 0)
        acct = _accounting(paths, rec, infos.get(jid)) if not is_active(state) else {}
        out.append(RunStatus(
            run_id=paths.run_id, name=rec.name, job_id=jid, state=state, nodes=nodes, elapsed=elapsed,
            restarts=restarts, jobs=len(rec.job_ids), run_dir=str(paths.run_dir), created=rec.created,
            goodput=acct.get("goodput"), node_hours=acct.get("node_hours"), gpu_hours=acct.get("gpu_hours"),
            lost_node_hours=acct.get("lost_node_hours"), snapshot=rec.snapshot,
            reason=_pending_reason(infos.get(jid)),
            cause=headline(paths, jid, rec.num_tasks) if state in FAILED_STATES else "", executor=rec.executor,
            accounting=acct, stragglers=_stragglers(paths) if state == "RUNNING" else [],
            parts=parts_of(paths, rec, jid, is_active(state))))
    return out


def component_paths(paths: RunPaths, record: RunRecord, name: str) -> RunPaths:
    """Part `name`'s run folder of a heterogeneous run; one line where the run has no such part."""
    names = list(record.spec.components or {}) if record.spec else []
    if name not in names:
        raise SlurmkitError(f"no part {name!r}", where=f"{paths.run_id}:components",
                            valid=f"valid: {', '.join(names)}" if names else "valid: a run with components")
    assert record.spec is not None
    return paths.part(name, name == record.spec.primary)


def parts_of(paths: RunPaths, record: RunRecord, job_id: str, active: bool) -> list[JsonObject]:
    """Each part's state: RUNNING while its last step runs; once ended, COMPLETED or FAILED as its
    ranks' outcome records say, FAILED where its step failed on its own (a rank killed writes no
    record), else ENDED (ended by the job: a stop, or its primary part done)."""
    if record.spec is None or record.spec.components is None:
        return []
    last: dict[str, JsonObject] = {}
    launched: dict[str, int] = {}
    for e in iter_records(paths.supervisor_events):
        if e.get("job_id") == job_id and "part" in e:
            last[str(e["part"])] = e
            if e.get("event") == "launch":  # part_attempt: this incarnation's in-job restarts of the part
                launched[str(e["part"])] = int(e.get("part_attempt") or 0)
    out: list[JsonObject] = []
    for name in record.spec.components:
        own = component_paths(paths, record, name)
        ranks = RunFile(own).read().num_tasks if own != paths else record.num_tasks
        running = active and last.get(name, {}).get("event") == "launch"
        ended = own.outcome_state(job_id, ranks)
        failed = last.get(name, {}).get("event") == "part_ended" and last[name].get("exit_code") \
            and not last[name].get("by_job")
        state = ("RUNNING" if running else ended if ended != "UNKNOWN" else "FAILED" if failed
                 else "ENDED" if name in last else "PENDING")
        out.append({"name": name, "state": state, "ranks": ranks, "in_job_restarts": launched.get(name, 0),
                    "run_dir": str(own.run_dir)})
    return out


def _stragglers(paths: RunPaths) -> list[JsonObject]:
    return [{**asdict(s), "since": dt.datetime.fromtimestamp(s.since).isoformat(timespec="seconds")}
            for s in Stragglers.read(paths)]


def _pending_reason(info: commands.JobInfo | None) -> str:
    return info.reason if info is not None and info.state == "PENDING" and info.reason not in ("", "None") else ""


def _accounting(paths: RunPaths, rec: RunRecord, info: commands.JobInfo | None) -> JsonObject:
    """A finished run's goodput (a training run's) and cost, from the sacct answer status already has
    and the run's metrics; nothing is written (an older run's cached value in run.json is read)."""
    cached = rec.goodput or {}
    if info is None or cached.get("job_id") == info.job_id:
        return cached
    if not info.history or info.active or any(i.end is None for i in info.history):
        return {}  # accounting has not recorded the end yet
    acc = goodput.of_file(paths.metrics, list(info.history))
    result = acc.result() if acc.newest is not None else None
    spent = cost.of_run(list(info.history), cost.gpus_per_node(rec.resources), result.productive_s if result else 0.0)
    return {**(result.as_dict() if result else {"goodput": None}), **spent.as_dict(), "job_id": info.job_id}


def status(scope: Scope | str, runs: list[str] | None = None) -> list[RunStatus]:
    """Runs asked for by id (an unreadable record is an error), else every run of the caller
    the scope sees (other users' folders and unreadable records skipped, each with a warning); a
    run root alone is a Slurm profile's scope. It reads only: nothing is written."""
    scope = Scope(scope) if isinstance(scope, str) else scope
    if runs:
        return statuses([(p, RunFile(p).read()) for p in (find_in(scope, r) for r in runs)])
    return statuses([(p, r) for p, r in read_records(list_runs(scope.run_root)) if scope.sees(r)])


def run_state(paths: RunPaths) -> RunStatus:
    return statuses([(paths, RunFile(paths).read())])[0]


def is_active(state: str) -> bool:
    return state in commands.ACTIVE_STATES or state == "UNKNOWN"


def wait(paths: RunPaths, poll_s: float = 2.0, timeout_s: float | None = None,
         poller: Poller | None = None, on_answer: Callable[[RunStatus], None] | None = None) -> RunStatus:
    """Poll until the run is no longer active (or timeout_s passes): every poll_s at first, then
    backing off (slurmkit.runs.polling), one squeue (and at most one sacct) a poll. on_answer sees
    every status polled (the CLI shows the transitions)."""
    return (poller or Poller(first_s=poll_s)).until_ended(
        lambda: run_state(paths), lambda st: {st.state} if is_active(st.state) else set(), timeout_s, on_answer,
        survive=(commands.TransientSlurmError,))


def describe(st: RunStatus) -> str:
    """A state as a transition line shows it: PENDING (Priority), RUNNING on node[1-2], COMPLETED."""
    if st.reason:
        return f"{st.state} ({st.reason})"
    return f"{st.state} on {st.nodes}" if st.state == "RUNNING" and st.nodes else st.state
