"""Finding a run from what a user types: a run id, a unique prefix, a folder (slurmkit.runs.folders), or a
raw Slurm job id; and listing the caller's runs under run_root.

A job id (`123`, or `123_4` for an array task) is what squeue, sacct and the Slurm mail show, so
every command that takes a run takes one too: the plain run whose record holds it, else the
sweep task that array task ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from slurmkit import trust
from slurmkit.common.layout import RUN_FILE, RunPaths
from slurmkit.common.locked import CorruptRecordError
from slurmkit.common.record import RunFile, RunRecord
from slurmkit.common.sweep_layout import ArrayLog
from slurmkit.errors import RunNotFoundError, warn
from slurmkit.runs.folders import find_folder, list_sweeps, owned_folders


@dataclass(frozen=True)
class Scope:
    """The runs a profile sees: those under its run_root; under a profile of the local executor,
    only local runs (a Slurm run's state, logs and cancel need Slurm, which such a profile never
    runs, whatever is on PATH). A Slurm profile sees local runs too: they need no Slurm."""

    run_root: str
    executor: str = "slurm"

    def sees(self, record: RunRecord) -> bool:
        return self.executor != "local" or record.executor != "slurm"


def find_in(scope: Scope, ident: str) -> RunPaths:
    """find() within what the scope sees; a Slurm run under a local profile is one line naming its profile."""
    paths = find(scope.run_root, ident)
    record = RunFile(paths).read()
    if not scope.sees(record):
        raise RunNotFoundError(f"run {paths.run_id} ran on Slurm (profile {record.profile_name or '?'}), and this "
                               "profile runs locally: it never calls Slurm", where=scope.run_root,
                               valid=f"valid: -p {record.profile_name or 'PROFILE'} (the run's own profile)")
    return paths


def find(run_root: str, ident: str) -> RunPaths:
    """The run `ident` names; a job id is looked up only when no run id matches it."""
    try:
        return find_run(run_root, ident)
    except RunNotFoundError:
        job_id = trust.job_of(ident)
        m = trust.JOB_ID_RE.match(job_id)
        found = _by_job_id(run_root, job_id, m.group(1), m.group(2)) if m else None
        if found is None:
            raise
        return found


def _by_job_id(run_root: str, job_id: str, base: str, task: str | None) -> RunPaths | None:
    for paths in list_runs(run_root):
        try:
            if job_id in RunFile(paths).read().job_ids:
                return paths
        except (RunNotFoundError, CorruptRecordError):  # skipped here; `list` reports it
            continue
    for sweep in list_sweeps(run_root):
        try:
            arrays = ArrayLog(sweep).read().arrays
        except (RunNotFoundError, CorruptRecordError):  # skipped here; `sweep list` reports it
            continue
        for arr in arrays:
            if arr.single and arr.job_id == job_id and sweep.task(arr.indices[0]).record.exists():
                return sweep.task(arr.indices[0])  # a heterogeneous task's own job
            if task is None or arr.single:
                continue
            index = arr.base + int(task)
            if arr.job_id == base and index in arr.indices:
                if not sweep.task(index).record.exists():
                    raise RunNotFoundError(f"job {job_id} is task {index} of sweep {sweep.sweep_id}, which has not "
                                           "started yet", where=str(sweep.sweep_dir),
                                           valid=f"see `slurmkit sweep status {sweep.sweep_id}`")
                return sweep.task(index)
    return None


def list_runs(run_root: str) -> list[RunPaths]:
    """The caller's runs under the root, newest first; other users' folders are skipped, with a count on stderr."""
    return [RunPaths(d) for d in owned_folders(run_root, RUN_FILE, "run")]


T = TypeVar("T")
R = TypeVar("R")


def readable(items: list[T], read: Callable[[T], R]) -> list[tuple[T, R]]:
    """Each item with what `read` gives; an unreadable record is skipped with one warning line naming it."""
    out = []
    for item in items:
        try:
            out.append((item, read(item)))
        except (CorruptRecordError, RunNotFoundError) as exc:
            warn(f"skipped {exc.one_line()}")
    return out


def read_records(runs: list[RunPaths]) -> list[tuple[RunPaths, RunRecord]]:
    """Each run with its run.json; a corrupt one is skipped with one warning line naming it."""
    return readable(runs, lambda p: RunFile(p).read())


def find_run(run_root: str, run: str) -> RunPaths:
    """A run by id, unique id prefix, or path of its folder."""
    return RunPaths(find_folder(run_root, run, RUN_FILE, "run"))
