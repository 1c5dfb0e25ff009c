"""--after / --after-any / --after-notok RUN_OR_SWEEP: the sbatch dependency that starts a job once
a run or a sweep succeeded, ended in any way, or failed.

Serves plain runs (`slurmkit submit --after`) and sweeps (`slurmkit sweep --after`) alike.
"""

from __future__ import annotations

from slurmkit.common.record import RunFile
from slurmkit.common.sweep_layout import Manifest, latest_job_ids
from slurmkit.errors import PreflightError, RunNotFoundError, clip
from slurmkit.runs.folders import find_sweep
from slurmkit.runs.lookup import find
from slurmkit.slurm import commands
from slurmkit.trust import JOB_ID_RE

AFTER_KINDS = ("afterok", "afterany", "afternotok")


def after_dependency(run_root: str, ident: str, kind: str = "afterok") -> str:
    """`kind` (afterok, afterany, afternotok) on a sweep's arrays, a run's newest job, or a raw
    Slurm job id, for --after / --after-any / --after-notok RUN_OR_SWEEP_OR_JOB."""
    assert kind in AFTER_KINDS
    try:
        manifest = Manifest(find_sweep(run_root, ident)).read()
        executor = manifest.executor
        ids = [j for j in latest_job_ids(manifest).values() if j]
        # After a resubmit the first array holds failures forever; then depend on each task's newest job.
        if not any(a.kind == "resubmit" for a in manifest.arrays):
            ids = list(dict.fromkeys(commands.base_id(j) for j in ids))
    except RunNotFoundError:
        try:
            record = RunFile(find(run_root, ident)).read()
        except RunNotFoundError:
            if JOB_ID_RE.match(ident):  # a Slurm job slurmkit did not submit: Slurm itself checks it
                return f"{kind}:{ident}"
            raise RunNotFoundError(f"--after: no run or sweep {clip(ident)}", where=run_root,
                                   valid="valid: a run id (`slurmkit list`), a sweep id (`slurmkit sweep list`) or "
                                         "a Slurm job id") from None
        executor, ids = record.executor, record.job_ids[-1:]
    if executor == "local":
        raise PreflightError("--after needs a Slurm run or sweep; a local one has no job id Slurm knows", where=ident)
    if not ids:
        raise PreflightError(f"--after {ident}: it has no submitted job", where=ident)
    return f"{kind}:" + ":".join(ids)
