"""--after RUN_OR_SWEEP: the sbatch dependency that starts a job only once a run or a sweep succeeded.

Serves plain runs (`slurmkit submit --after`) and sweeps (`slurmkit sweep --after`) alike.
"""

from __future__ import annotations

from slurmkit.errors import PreflightError, RunNotFoundError, clip
from slurmkit.runs import RunRecord, find_run
from slurmkit.slurm import commands
from slurmkit.sweeps.store import Manifest, find_sweep, latest_job_ids


def after_dependency(run_root: str, ident: str) -> str:
    """`afterok` on a sweep's arrays or a run's newest job, for --after RUN_OR_SWEEP."""
    try:
        manifest = Manifest(find_sweep(run_root, ident)).read()
        executor = manifest["executor"]
        ids = [j for j in latest_job_ids(manifest).values() if j]
        # After a resubmit the first array holds failures forever; then depend on each task's newest job.
        if not any(a.get("kind") == "resubmit" for a in manifest["arrays"]):
            ids = list(dict.fromkeys(commands.base_id(j) for j in ids))
    except RunNotFoundError:
        try:
            record = RunRecord(find_run(run_root, ident)).read()
        except RunNotFoundError:
            raise RunNotFoundError(f"--after: no run or sweep {clip(ident)}", where=run_root,
                                   valid="valid: a run id (`slurmkit list`) or a sweep id (`slurmkit sweep list`)"
                                   ) from None
        executor, ids = record.get("executor"), list(record.get("job_ids") or [])[-1:]
    if executor == "local":
        raise PreflightError("--after needs a Slurm run or sweep; a local one has no job id Slurm knows", where=ident)
    if not ids:
        raise PreflightError(f"--after {ident}: it has no submitted job", where=ident)
    return "afterok:" + ":".join(ids)
