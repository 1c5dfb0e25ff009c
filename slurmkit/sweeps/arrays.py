"""A sweep's job arrays sent to sbatch, each array's job id recorded in the array log as soon as it
exists (so no task is ever dropped silently), and the live cluster's limits they must fit."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from slurmkit.calls import SweepTask
from slurmkit.common import perms
from slurmkit.common.atomic import atomic_write_text
from slurmkit.common.sweep_layout import ArrayEntry, ArrayLog, SweepPaths
from slurmkit.config.loader import Resolved
from slurmkit.errors import SlurmError, SlurmkitError, squash
from slurmkit.slurm import commands
from slurmkit.sweeps.plan import compress


def cluster_limits() -> tuple[int, int]:
    """(MaxArraySize, MaxJobCount) of the live cluster."""
    conf = commands.show_config()
    return int(conf.get("MaxArraySize", "1001")), int(conf.get("MaxJobCount", "10000"))


def submit_arrays(paths: SweepPaths, groups: list[Resolved], planned: list[dict[str, Any]],
                   kind: Literal["initial", "resubmit"], dependency: str | None, max_parallel: int | None) -> list[str]:
    """sbatch each planned array, recording each job id in the array log as soon as it exists."""
    from slurmkit.slurm.submitit_executor import ArraySpec, RenderedSlurmExecutor

    created = dt.datetime.now().isoformat(timespec="seconds")
    arrays = [ArrayEntry(kind=kind, created=created, **arr) for arr in planned]
    chain = max_parallel and len(arrays) > 1
    with ArrayLog(paths).editing() as log:
        first_number = len(log.arrays)
        log.arrays.extend(arrays)
    ids: list[str] = []
    for k, arr in enumerate(arrays):
        deps = [d for d in (dependency, f"afterany:{ids[-1]}" if chain and ids else None) if d]
        executor = RenderedSlurmExecutor(paths.job_folder, groups[arr.group], ",".join(deps) or None)
        spec = ArraySpec(arr.array, [i - arr.base for i in arr.indices], arr.base, str(paths.sweep_dir),
                         str(paths.array_pickle(first_number + k)))
        try:
            job_id = executor.submit_sweep_array(SweepTask(str(paths.sweep_dir), arr.base), spec)
        except Exception as exc:
            detail = squash(str(exc))
            with ArrayLog(paths).editing() as log:
                log.arrays[first_number + k].error = detail
            if isinstance(exc, SlurmkitError):
                raise
            queued = first_number + k > 0  # else submit() removes the sweep: nothing to resubmit
            raise SlurmError(f"array {first_number + k} (tasks {compress(arr.indices)}) failed to submit: {detail}",
                             where=paths.sweep_id, valid="its tasks show NOT_SUBMITTED; `slurmkit sweep resubmit "
                             "SWEEP --failed` retries them" if queued else None) from exc
        ids.append(job_id)
        atomic_write_text(paths.script(first_number + k), executor.last_script or "", perms.file_mode(paths.sweep_dir))
        with ArrayLog(paths).editing() as log:
            log.arrays[first_number + k].job_id = job_id
    return ids
