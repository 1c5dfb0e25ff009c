"""A run's result: rank 0's (or any rank's) return value, or its failure as one error."""

from __future__ import annotations

from typing import Any

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.errors import JobFailedError, SlurmkitError
from slurmkit.runs.failure import failure
from slurmkit.runs.jobs.status import is_active, run_state


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
        # Marked by the supervisor when the ranks saved in time; Slurm's own PREEMPTED when the grace ran out first.
        marked = RunFile(paths).read().preempted
        why = marked.detail if marked is not None else "Slurm ended it at the end of its grace"
        raise JobFailedError(f"run was preempted (job {st.job_id}): {why}", where=paths.run_id,
                             valid=f"resume it with `slurmkit resubmit {paths.run_id}`")
    failed = failure(paths, st.job_id)
    raise JobFailedError(f"run ended {st.state} (job {st.job_id}): {failed.headline}", where=paths.run_id,
                         valid=f"every rank's output: `slurmkit logs {paths.run_id}`", log_tail=failed.log_tail,
                         rank=failed.rank, cause=failed.cause, trace=failed.trace, full=failed.full)
