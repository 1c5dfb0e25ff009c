"""Finding a run from what a user types: a run id, a unique prefix, a folder, or a raw Slurm job id.

A job id (`123`, or `123_4` for an array task) is what squeue, sacct and the Slurm mail show, so
every command that takes a run takes one too: the plain run whose record holds it, else the
sweep task that array task ran.
"""

from __future__ import annotations

import re

from slurmkit.errors import RunNotFoundError
from slurmkit.runs import CorruptRecordError, RunPaths, RunRecord, find_run, list_runs

JOB_ID_RE = re.compile(r"^(\d+)(?:_(\d+))?$")


def find(run_root: str, ident: str) -> RunPaths:
    """The run `ident` names; a job id is looked up only when no run id matches it."""
    try:
        return find_run(run_root, ident)
    except RunNotFoundError:
        m = JOB_ID_RE.match(ident)
        found = _by_job_id(run_root, ident, m.group(1), m.group(2)) if m else None
        if found is None:
            raise
        return found


def _by_job_id(run_root: str, job_id: str, base: str, task: str | None) -> RunPaths | None:
    for paths in list_runs(run_root):
        try:
            if job_id in (RunRecord(paths).read().get("job_ids") or []):
                return paths
        except (RunNotFoundError, CorruptRecordError):  # skipped here; `list` reports it
            continue
    if task is None:
        return None
    from slurmkit.sweeps.store import ArrayLog, list_sweeps

    for sweep in list_sweeps(run_root):
        for arr in ArrayLog(sweep).read()["arrays"]:
            index = arr["base"] + int(task)
            if arr.get("job_id") == base and index in arr["indices"]:
                if not sweep.task(index).record.exists():
                    raise RunNotFoundError(f"job {job_id} is task {index} of sweep {sweep.sweep_id}, which has not "
                                           "started yet", where=str(sweep.sweep_dir),
                                           valid=f"see `slurmkit sweep status {sweep.sweep_id}`")
                return sweep.task(index)
    return None
