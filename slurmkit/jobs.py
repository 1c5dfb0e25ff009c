"""Submit, watch, cancel and collect runs: the library behind `slurmkit submit/status/logs/...`."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurmkit.config.loader import Resolved
from slurmkit.errors import JobFailedError, SlurmError, SlurmkitError
from slurmkit.procs import pid_alive
from slurmkit.runs import RunPaths, RunRecord, expand_root, find_run, list_runs
from slurmkit.slurm import commands

LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class Submitted:
    run_id: str
    job_id: str | None
    run_dir: str
    script: str


def run_env(resolved: Resolved, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every rank gets on top of the batch script's: profile, then spec, then extra."""
    return {**resolved.profile.setup.env, **resolved.spec.env, **(extra or {})}


def entry(resolved: Resolved, paths: RunPaths) -> Any:
    """The callable submitit pickles for this run."""
    from slurmkit.worker.entry import Run

    return Run(spec=resolved.spec.model_dump(), run_dir=str(paths.run_dir), env=run_env(resolved),
               checkpoint_uri=paths.checkpoint_uri(resolved.profile.checkpoint_root))


def dry_run(resolved: Resolved, dependency: str | None = None) -> Submitted:
    """Render exactly what submit would, creating nothing and calling no Slurm daemon."""
    from slurmkit.slurm.executor import rank_python, render_for, submitit_command

    paths = RunPaths(expand_root(resolved.profile.run_root) / "<run-id>")
    script = render_for(resolved, paths.job_folder, submitit_command(rank_python(resolved), paths.job_folder),
                        dependency=dependency)
    return Submitted(run_id="<run-id>", job_id=None, run_dir=str(paths.run_dir), script=script)


def submit(resolved: Resolved, dependency: str | None = None) -> Submitted:
    """Pre-flight, create the run folder and record, submit through submitit, record the job id.

    dependency is an sbatch --dependency value, e.g. from sweeps.submit.after_dependency.
    """
    from slurmkit.slurm import executor as ex_mod

    slurm = resolved.profile.executor == "slurm"
    if slurm:
        from slurmkit.slurm import preflight

        preflight.check(resolved)
    paths = RunPaths.create(resolved.profile.run_root, resolved.spec.name)
    record = RunRecord(paths)
    record.write({
        "run_id": paths.run_id, "name": resolved.spec.name, "run_dir": str(paths.run_dir),
        "created": dt.datetime.now().isoformat(timespec="seconds"), "executor": resolved.profile.executor,
        "profile_name": resolved.profile_name, "spec_source": resolved.spec_source,
        "spec": resolved.spec.model_dump(), "profile": resolved.profile.model_dump(),
        "resources": resolved.resources.model_dump(), "num_tasks": resolved.num_tasks, "job_ids": [],
    })
    try:
        if slurm:
            executor: Any = ex_mod.RenderedSlurmExecutor(paths.job_folder, resolved, dependency)
        else:
            if dependency:
                raise SlurmkitError("--after needs the slurm executor", where=resolved.profile_name,
                                    valid="valid: a Slurm profile, e.g. -p devcluster")
            executor = ex_mod.local_executor(paths.job_folder, resolved)
        job = executor.submit(entry(resolved, paths))
    except Exception as exc:
        # Nothing was queued: leave no record that could claim a job.
        shutil.rmtree(paths.run_dir, ignore_errors=True)
        if isinstance(exc, SlurmkitError):
            raise
        detail = " ".join(str(exc).split())[-300:]
        raise SlurmError(f"submission failed: {detail}", where=resolved.profile_name) from exc
    script = getattr(executor, "last_script", None) or ""
    if script:
        paths.script.write_text(script)
    record.update(script=script)
    record.add_job_id(str(job.job_id))
    return Submitted(run_id=paths.run_id, job_id=str(job.job_id), run_dir=str(paths.run_dir), script=script)


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
    """Productive step time / wall time, once the run has ended on Slurm (see slurmkit.goodput)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def local_state(paths: RunPaths, job_id: str, num_tasks: int) -> str:
    """A local run's state from its controller pid and result pickles (no scheduler to ask)."""
    if job_id.isdigit() and pid_alive(int(job_id)):
        return "RUNNING"
    outcomes = [paths.outcome(job_id, t) for t in range(num_tasks)]
    return "COMPLETED" if all(o is not None and o[0] == "success" for o in outcomes) else "FAILED"


def statuses(records: list[dict[str, Any]]) -> list[RunStatus]:
    """Status of many runs with one squeue call (and one sacct call for finished jobs)."""
    slurm_ids = [r["job_ids"][-1] for r in records if r.get("job_ids") and r.get("executor") == "slurm"]
    infos = commands.job_states(slurm_ids) if slurm_ids else {}
    out: list[RunStatus] = []
    for rec in records:
        job_ids = rec.get("job_ids") or []
        jid = job_ids[-1] if job_ids else ""
        state, nodes, elapsed = "NOT_SUBMITTED", "", ""
        if jid and rec.get("executor") == "local":
            state = local_state(RunPaths(Path(rec["run_dir"])), jid, int(rec.get("num_tasks", 1)))
        elif jid:
            info = infos.get(jid)
            state = info.state if info else "UNKNOWN"
            nodes, elapsed = (info.nodes, info.elapsed) if info else ("", "")
        # run.json knows every restart and its cause, whichever incarnation is live now.
        restarts = max(len(rec.get("restarts", [])), infos[jid].restarts if jid in infos else 0)
        out.append(RunStatus(rec["run_id"], rec.get("name", ""), jid, state, nodes, elapsed, restarts,
                             len(job_ids), rec["run_dir"], rec.get("created", ""),
                             _goodput(rec, infos.get(jid)) if not is_active(state) else None))
    return out


def _goodput(rec: dict[str, Any], info: commands.JobInfo | None) -> float | None:
    """A finished training run's goodput, from the sacct answer status already has; cached in run.json."""
    cached = rec.get("goodput") or {}
    if info is None or cached.get("job_id") == info.job_id:
        return cached.get("goodput")
    if not info.history or info.active or any(i.end is None for i in info.history):
        return None  # accounting has not recorded the end yet
    from slurmkit import goodput
    from slurmkit.worker.metrics import read_records

    paths = RunPaths(Path(rec["run_dir"]))
    steps = read_records(paths.metrics)
    value = goodput.account(steps, list(info.history)).as_dict() if steps else {"goodput": None}
    RunRecord(paths).update(goodput={**value, "job_id": info.job_id})
    return value["goodput"]


def status(run_root: str, runs: list[str] | None = None) -> list[RunStatus]:
    paths = [find_run(run_root, r) for r in runs] if runs else list_runs(run_root)
    return statuses([RunRecord(p).read() for p in paths])


def run_state(paths: RunPaths) -> RunStatus:
    return statuses([RunRecord(paths).read()])[0]


def is_active(state: str) -> bool:
    return state in commands.ACTIVE_STATES or state == "UNKNOWN"


UNKNOWN_GRACE_S = 120.0


def wait(paths: RunPaths, poll_s: float = 2.0, timeout_s: float | None = None) -> RunStatus:
    """Poll until the run is no longer active (or timeout_s passes)."""
    start = time.monotonic()
    unknown_since: float | None = None
    while True:
        st = run_state(paths)
        now = time.monotonic()
        # Neither squeue nor sacct knowing the job for long (accounting wiped): stop waiting.
        unknown_since = (unknown_since or now) if st.state == "UNKNOWN" else None
        if (not is_active(st.state) or (timeout_s is not None and now - start > timeout_s)
                or (unknown_since is not None and now - unknown_since > UNKNOWN_GRACE_S)):
            return st
        time.sleep(poll_s)


# ---------------------------------------------------------------- cancel / result / logs

def cancel(paths: RunPaths) -> list[str]:
    rec = RunRecord(paths).read()
    ids = list(rec.get("job_ids") or [])
    if not ids:
        return []
    if rec.get("executor") == "local":
        for jid in ids:
            if jid.isdigit() and pid_alive(int(jid)):
                os.kill(int(jid), signal.SIGINT)
    else:
        commands.scancel(ids)
    RunRecord(paths).update(cancelled=True)
    return ids


def result(paths: RunPaths, rank: int = 0) -> Any:
    """The callable's return value on `rank`; a failure raises with the failing rank's log tail."""
    st = run_state(paths)
    if not st.job_id:
        raise JobFailedError("run was never submitted", where=paths.run_id)
    outcome = paths.outcome(st.job_id, rank)
    if outcome is not None and outcome[0] == "success":
        return outcome[1]
    if is_active(st.state):
        raise SlurmkitError(f"run is still {st.state}; no result yet", where=paths.run_id,
                            valid="wait with `slurmkit submit --wait` or poll `slurmkit status`")
    failing, tail = failing_rank_tail(paths, st.job_id)
    raise JobFailedError(f"run ended {st.state} (job {st.job_id}); rank {failing} log tail: {tail}",
                         where=paths.run_id)


def failing_rank_tail(paths: RunPaths, job_id: str) -> tuple[int, str]:
    """The first rank whose result is an error or missing, and the tail of its stderr."""
    rec = RunRecord(paths).read()
    failing = 0
    for rank in range(int(rec.get("num_tasks", 1))):
        outcome = paths.outcome(job_id, rank)
        if outcome is None or outcome[0] != "success":
            failing = rank
            break
    lines: list[str] = []
    for stream in ("err", "out"):
        log = paths.rank_log(job_id, failing, stream)
        if log.exists():
            lines += [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return failing, " | ".join(lines[-LOG_TAIL_LINES:]) or "(no log)"


def _log_files(paths: RunPaths, rank: int | None) -> list[tuple[str, Path]]:
    rec = RunRecord(paths).read()
    files: list[tuple[str, Path]] = []
    for jid in rec.get("job_ids") or []:
        ranks = [rank] if rank is not None else list(paths.rank_logs(jid))
        for rk in ranks:
            for stream in ("out", "err"):
                label = f"[{rk}]" if stream == "out" else f"[{rk}!]"
                files.append((label, paths.rank_log(jid, rk, stream)))
    return files


def logs(paths: RunPaths, rank: int | None = None, follow: bool = False,
         poll_s: float = 1.0) -> Iterator[str]:
    """Every rank's lines prefixed [rank] ([rank!] for stderr); follow until the run ends."""
    offsets: dict[Path, int] = {}
    partial: dict[Path, str] = {}
    while True:
        # Read the state before the files, so lines written just before the end are not missed.
        done = not follow or not is_active(run_state(paths).state)
        for label, path in _log_files(paths, rank):
            if not path.exists():
                continue
            with open(path, errors="replace") as f:
                f.seek(offsets.get(path, 0))
                chunk = partial.pop(path, "") + f.read()
                offsets[path] = f.tell()
            *complete, rest = chunk.split("\n")
            if rest:
                if done:
                    complete.append(rest)
                else:
                    partial[path] = rest
            for line in complete:
                yield f"{label} {line}"
        if done:
            return
        time.sleep(poll_s)
