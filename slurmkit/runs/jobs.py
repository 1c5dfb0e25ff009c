"""Submit, watch, cancel and collect runs: the library behind `slurmkit submit/status/logs/...`."""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slurmkit.common import perms
from slurmkit.common.cause import Cause
from slurmkit.common.errors import ConfigError, JobFailedError, SlurmError, SlurmkitError, squash
from slurmkit.common.layout import RunPaths, expand_root
from slurmkit.common.record import RestartEntry, RunFile, RunRecord
from slurmkit.config.loader import Resolved
from slurmkit.insight import cost, goodput
from slurmkit.runs import local_checks, procs, registry, snapshot
from slurmkit.runs.failure import failure, headline
from slurmkit.runs.lookup import Scope, find_in, list_runs, read_records
from slurmkit.runs.polling import Poller
from slurmkit.slurm import commands, preflight

FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"})
"""Ended states a rank's error explains (`status` shows its cause); TIMEOUT and CANCELLED say theirs."""


@dataclass(frozen=True)
class Submitted:
    run_id: str
    job_id: str | None
    run_dir: str
    script: str


def run_env(resolved: Resolved, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every rank gets on top of the batch script's: profile, then spec, then extra."""
    return {**resolved.profile.setup.env, **resolved.spec.env, **(extra or {})}


@dataclass(frozen=True)
class Call:
    """A Python function and its arguments, carried by value in the job's pickle (slurmkit.Executor)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def entry(resolved: Resolved, paths: RunPaths, call: Call | None = None) -> Any:
    """The callable submitit pickles for this run."""
    from slurmkit.worker.entry import Run  # the meeting point with the job's side (docs/design.md)

    return Run(spec=resolved.spec.model_dump(), run_dir=str(paths.run_dir), env=run_env(resolved),
               checkpoint_uri=paths.checkpoint_uri(resolved.profile.checkpoint_root),
               fn=call.fn if call else None, args=call.args if call else (),
               kwargs=dict(call.kwargs) if call else {},
               code_dir=str(paths.code_dir) if resolved.snapshot else None)


def check_function_kind(resolved: Resolved, call: Call | None) -> None:
    """A spec's `function` is a Python function's name; only a submit from Python carries the function."""
    if resolved.spec.function is not None and call is None:
        raise ConfigError("function is set only by slurmkit.Executor.submit", where=f"{resolved.spec_source}:function",
                          valid="valid: callable: module:function in a spec file")
    if call is not None and resolved.spec.function is None:
        raise ConfigError("a Python function needs a spec of kind function", where=resolved.spec_source)


def take_snapshot(resolved: Resolved, run_dir: Path, call: Call | None) -> dict[str, Any] | None:
    """The code snapshot (when the run asks for one) into the run folder; what run.json records."""
    if not resolved.snapshot:
        return None

    module = sys.modules.get(getattr(call.fn, "__module__", "") or "") if call else None
    return snapshot.into(run_dir, RunPaths(run_dir).code_dir, getattr(module, "__file__", None),
                         resolved.profile.snapshot_max_mb)


def dry_run(resolved: Resolved, dependency: str | None = None) -> Submitted:
    """Render exactly what submit would, creating nothing and calling no Slurm daemon."""
    from slurmkit.slurm.submitit_executor import rank_python, render_for, submitit_command

    local_checks.warn_idle_gpus(resolved)
    paths = RunPaths(expand_root(resolved.profile.run_root) / "<run-id>")
    script = render_for(resolved, paths.job_folder, submitit_command(rank_python(resolved), paths.job_folder),
                        dependency=dependency)
    return Submitted(run_id="<run-id>", job_id=None, run_dir=str(paths.run_dir), script=script)


def submit(resolved: Resolved, dependency: str | None = None, call: Call | None = None,
           preflighted: bool = False) -> Submitted:
    """Pre-flight, create the run folder and record, submit through submitit, record the job id.

    dependency is an sbatch --dependency value, e.g. from dependency.after_dependency. call is
    the Python function a `function` spec runs (slurmkit.Executor.submit). preflighted: the caller
    has just checked this same request against the live cluster (an Executor submitting again).
    Everything the submit creates gets the run's umask (perms); a submit that fails before
    anything is queued leaves nothing behind.
    """
    from slurmkit.slurm import submitit_executor as ex_mod

    slurm = _check_request(resolved, dependency, call, preflighted)
    run_mode = resolved.profile.run_mode
    with perms.umask(run_mode):
        paths = registry.create(resolved.profile.run_root, resolved.spec.name, run_mode,
                                resolved.profile.checkpoint_root)
        record = RunFile(paths)
        with registry.or_nothing(paths):  # nothing queued: no folder, no record that could claim a job
            record.create(RunRecord(
                run_id=paths.run_id, name=resolved.spec.name, run_dir=str(paths.run_dir),
                created=dt.datetime.now().isoformat(timespec="seconds"), executor=resolved.profile.executor,
                profile_name=resolved.profile_name, spec_source=resolved.spec_source,
                spec=resolved.spec.model_dump(), profile=resolved.profile.model_dump(),
                resources=resolved.resources.model_dump(), num_tasks=resolved.num_tasks))
            if (snap := take_snapshot(resolved, paths.run_dir, call)) is not None:
                record.update(snapshot=snap)
            try:
                if slurm:
                    executor: Any = ex_mod.RenderedSlurmExecutor(paths.job_folder, resolved, dependency)
                else:
                    executor = ex_mod.local_executor(paths.job_folder, resolved)
                job = executor.submit(entry(resolved, paths, call))
            except Exception as exc:
                if isinstance(exc, (SlurmkitError, OSError)):
                    raise
                raise SlurmError(f"submission failed: {squash(str(exc))}", where=resolved.profile_name) from exc
        # Queued: the job id is recorded first (with the script, in one write), so nothing later can lose it.
        job_id = str(job.job_id)
        script = getattr(executor, "last_script", None) or ""
        record.add_job_id(job_id, pid_start=None if slurm else procs.start_time(int(job_id)), script=script)
        if script:
            registry.write_script(paths, script)
    return Submitted(run_id=paths.run_id, job_id=job_id, run_dir=str(paths.run_dir), script=script)


def _check_request(resolved: Resolved, dependency: str | None, call: Call | None, preflighted: bool) -> bool:
    """What can be checked before anything is created; whether the run goes to Slurm."""
    check_function_kind(resolved, call)
    container = resolved.profile.container
    check_secrets(resolved.spec.secret_env, resolved.spec_source,
                  {**resolved.profile.setup.env, **(container.env if container else {})})
    local_checks.warn_idle_gpus(resolved)
    if resolved.profile.executor == "slurm":
        if not preflighted:
            preflight.check(resolved)
        return True
    if dependency:
        raise SlurmkitError("--after needs the slurm executor", where=resolved.profile_name,
                            valid="valid: a Slurm profile, e.g. -p devcluster")
    local_checks.check(resolved)
    return False


def check_secrets(names: list[str], source: str, written: dict[str, str]) -> None:
    """secret_env's variables are set here (the job takes them from this environment) and given no
    value that would be written down (the profile's setup.env or container.env)."""
    if missing := [n for n in names if n not in os.environ]:
        raise ConfigError(f"secret_env {', '.join(missing)} not set in this environment", where=f"{source}:secret_env",
                          valid="valid: export them before submitting (their values go only to the job)")
    if named := sorted(set(names) & set(written)):
        raise ConfigError(f"secret_env {', '.join(named)} has a value in the profile, which would be written down",
                          where=f"{source}:secret_env", valid="valid: leave it out of the profile's env")


# ---------------------------------------------------------------- status

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
    snapshot: dict[str, Any] | None = None
    """The code snapshot the run runs from (slurmkit.runs.snapshot), if it took one."""
    reason: str = ""
    """Why a pending job waits, as squeue says it (Priority, Resources, BeginTime, JobHeldUser, ...)."""
    cause: str = ""
    """A failed run's failing rank and its error (runs.failure): `rank 1: ValueError: bad input`."""
    executor: str = "slurm"
    """slurm: job_id is a Slurm job id; local: it is the process id of the run's controller."""

    @property
    def job_label(self) -> str:
        """The job id as a person reads it: a local run's says it is a process id."""
        return f"pid {self.job_id}" if self.executor == "local" and self.job_id else self.job_id

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def local_state(paths: RunPaths, record: RunRecord) -> str:
    """A local run's state from its controller (pid and start time) and its ranks' outcome records."""
    job_id = record.job_ids[-1] if record.job_ids else ""
    if procs.same_process(job_id, record.pid_starts.get(job_id)):
        return "RUNNING"
    by_outcomes = outcome_state(paths, job_id, record.num_tasks)
    return "COMPLETED" if by_outcomes == "COMPLETED" else "FAILED"


def outcome_state(paths: RunPaths, job_id: str, num_tasks: int) -> str:
    """What the ranks' outcome records say of an ended job: COMPLETED (every rank succeeded),
    FAILED (one recorded an error), else UNKNOWN. For a job neither squeue nor sacct knows (no
    accounting, or sacct failing), as for a local run."""
    # Only the records present are read (one listing): a record's num_tasks never costs a stat per rank.
    found = [paths.outcome(job_id, t) for t in paths.outcome_ranks(job_id) if t < num_tasks]
    if len(found) == num_tasks and all(o is not None and o.ok for o in found):
        return "COMPLETED"
    return "FAILED" if any(o is not None and not o.ok for o in found) else "UNKNOWN"


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
            state = info.state if info else outcome_state(paths, jid, rec.num_tasks)
            nodes, elapsed = (info.nodes, info.elapsed) if info else ("", "")
            if not is_active(state) and rec.preempted is not None and rec.preempted.job_id == jid:
                state = "PREEMPTED"  # it saved and exited within GraceTime, so Slurm says COMPLETED
        # run.json knows every restart and its cause, whichever incarnation is live now.
        restarts = max(len(rec.restarts), infos[jid].restarts if jid in infos else 0)
        acct = _accounting(paths, rec, infos.get(jid)) if not is_active(state) else {}
        out.append(RunStatus(paths.run_id, rec.name, jid, state, nodes, elapsed, restarts,
                             len(rec.job_ids), str(paths.run_dir), rec.created, acct.get("goodput"),
                             acct.get("node_hours"), acct.get("gpu_hours"), acct.get("lost_node_hours"),
                             rec.snapshot, _pending_reason(infos.get(jid)),
                             headline(paths, jid, rec.num_tasks) if state in FAILED_STATES else "", rec.executor))
    return out


def _pending_reason(info: commands.JobInfo | None) -> str:
    return info.reason if info is not None and info.state == "PENDING" and info.reason not in ("", "None") else ""


def _accounting(paths: RunPaths, rec: RunRecord, info: commands.JobInfo | None) -> dict[str, Any]:
    """A finished run's goodput (a training run's) and cost, from the sacct answer status already has;
    cached in run.json."""
    cached = rec.goodput or {}
    if info is None or cached.get("job_id") == info.job_id:
        return cached
    if not info.history or info.active or any(i.end is None for i in info.history):
        return {}  # accounting has not recorded the end yet
    acc = goodput.of_file(paths.metrics, list(info.history))
    result = acc.result() if acc.newest is not None else None
    spent = cost.of_run(list(info.history), cost.gpus_per_node(rec.resources), result.productive_s if result else 0.0)
    value = {**(result.as_dict() if result else {"goodput": None}), **spent.as_dict(), "job_id": info.job_id}
    RunFile(paths).update(goodput=value)
    return value


def status(scope: Scope | str, runs: list[str] | None = None) -> list[RunStatus]:
    """Runs asked for by id (an unreadable record is an error), else every run of the caller
    the scope sees (other users' folders and unreadable records skipped, each with a warning); a
    run root alone is a Slurm profile's scope.

    Not quite read-only: a finished run's goodput is computed once and cached in its run.json,
    through the locked editor, so a status racing the requeue policy loses neither's update."""
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


# ---------------------------------------------------------------- cancel / result / logs

def cancel(paths: RunPaths) -> list[str]:
    rec = RunFile(paths).read()
    ids = list(rec.job_ids)
    if not ids:
        return []
    if rec.executor == "local":
        # Only a controller that is still the process we started: its pid may have been reused.
        ids = [jid for jid in ids if procs.signal_process(jid, rec.pid_starts.get(jid), signal.SIGINT)]
    else:
        commands.scancel(ids)
    RunFile(paths).update(cancelled=True)
    return ids


def resubmit(paths: RunPaths, partition: str | None = None) -> Submitted:
    """Submit an ended run again under its run id: the same script and call as a new job, which
    resumes from the run's newest committed checkpoint. The single-run twin of `sweep resubmit`,
    for a run Slurm did not bring back: preempted under PreemptMode=CANCEL, a spent requeue
    budget, a cancel, a failure fixed since. Its dependency is dropped (it was met)."""
    rec = RunFile(paths).read()
    if rec.executor != "slurm":
        raise SlurmkitError("only a run on a Slurm profile can be resubmitted", where=paths.run_id,
                            valid="submit a local run again with `slurmkit submit`")
    st = run_state(paths)
    if is_active(st.state) or st.state == "COMPLETED":
        raise SlurmkitError(f"run is {st.state} (job {st.job_id}); nothing to resubmit", where=paths.run_id,
                            valid="valid: a run that ended other than COMPLETED; `slurmkit cancel` a live one first")
    check_secrets(list(rec.spec.get("secret_env") or []), paths.run_id, {})
    script = "".join(ln for ln in (rec.script or paths.script.read_text()).splitlines(keepends=True)
                     if not ln.startswith("#SBATCH --dependency="))
    from slurmkit.slurm import submitit_executor as ex_mod

    with perms.umask(perms.folder_kind(paths.run_dir)):
        job_id = ex_mod.resubmit(paths, st.job_id, script, partition)
    # The job id first, in its own write, as submit does: nothing later may lose it.
    RunFile(paths).add_job_id(job_id, script=script)
    on = f" on partition {partition}" if partition else ""
    with RunFile(paths).editing() as record:
        record.final = record.preempted = record.cancelled = None
        record.restarts.append(RestartEntry(
            kind="resubmit", n=0, job_id=job_id, cause=Cause.RESUBMIT,
            time=dt.datetime.now().isoformat(timespec="seconds"),
            detail=f"slurmkit resubmit{on} after job {st.job_id} ended {st.state}"))
    registry.write_script(paths, script)
    return Submitted(run_id=paths.run_id, job_id=job_id, run_dir=str(paths.run_dir), script=script)


def result(paths: RunPaths, rank: int = 0) -> Any:
    """The callable's return value on `rank`; a failure raises with the failing rank's log tail.

    The value is unpickled from submitit's result only in a folder the caller owns that no one
    else can write; elsewhere that refuses with one line (the JSON outcome is still readable).
    """
    st = run_state(paths)
    if not st.job_id:
        raise JobFailedError("run was never submitted", where=paths.run_id)
    outcome = paths.outcome(st.job_id, rank)
    legacy = outcome is None and paths.result_pickle(st.job_id, rank).exists()
    if (outcome is not None and outcome.ok) or legacy:
        state, value = paths.unpickle_result(st.job_id, rank)
        if state == "success":
            return value
    if is_active(st.state):
        raise SlurmkitError(f"run is still {st.state}; no result yet", where=paths.run_id,
                            valid="wait with `slurmkit submit --wait` or poll `slurmkit status`")
    if st.state == "PREEMPTED":
        # Marked by rank 0 when it saved in time; Slurm's own PREEMPTED when the grace ran out first.
        marked = RunFile(paths).read().preempted
        why = marked.detail if marked is not None else "Slurm ended it at the end of its grace"
        raise JobFailedError(f"run was preempted (job {st.job_id}): {why}", where=paths.run_id,
                             valid=f"resume it with `slurmkit resubmit {paths.run_id}`")
    failed = failure(paths, st.job_id)
    raise JobFailedError(f"run ended {st.state} (job {st.job_id}): {failed.headline}", where=paths.run_id,
                         valid=f"every rank's output: `slurmkit logs {paths.run_id}`", log_tail=failed.log_tail,
                         rank=failed.rank, cause=failed.cause, trace=failed.trace, full=failed.full)
