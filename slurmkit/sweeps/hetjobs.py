"""A sweep of a heterogeneous spec (components): each task one heterogeneous job of its own.

Slurm runs no heterogeneous job as an array task (sbatch answers "Invalid job array
specification"), so where a sweep of any other spec has one sbatch per chunk of tasks, this one has
one per task. The task's run folder (tasks/N, its run.json naming its sweep and index) and its
parts' folders are made at submit, and the job is the task's own heterogeneous run, as `slurmkit
submit` would queue it (supervisor.parts; on the local profile supervisor.local_parts): its
checkpoints under the sweep's key (SWEEP/N, a part's SWEEP/N.NAME), the sweep's code snapshot,
the task's seed in SLURMKIT_SEED.

On Slurm each task is one entry of the array log (`single`: its one index, its job id the task's),
written before its sbatch and given the job id as soon as sbatch answers, so `sweep status`,
`results`, `cancel` and `resubmit --failed` see it as any task, and none is dropped. The sweep's
max_parallel is a window: task k waits (`afterany`) for the task max_parallel places before it.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Literal

from slurmkit.build import build
from slurmkit.common import perms
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.common.sweep_layout import ArrayEntry, ArrayLog, SweepManifest, SweepPaths, task_record, task_spec
from slurmkit.config.profile import ClusterProfile
from slurmkit.config.resolved import Resolved
from slurmkit.errors import SlurmError, SlurmkitError, squash
from slurmkit.load.loader import resolve_layers
from slurmkit.runs.jobs.submit import Place, queue, recorded
from slurmkit.sweeps.arrays import note_sbatch


def heterogeneous(manifest: SweepManifest) -> bool:
    """The sweep's tasks are heterogeneous runs (its spec has components)."""
    return bool(manifest.tasks) and bool(task_spec(manifest, 0).get("components"))


def task_resolved(manifest: SweepManifest, index: int) -> Resolved:
    """Task `index`'s run, resolved again from the manifest (its whole validated spec) and the
    sweep's profile, as its submit resolved it: each part its own."""
    profile = ClusterProfile.model_validate(manifest.profile)
    return resolve_layers([(f"{manifest.source}:sweep[{index}]", task_spec(manifest, index))], profile,
                          manifest.profile_name)


def submit_one(paths: SweepPaths, manifest: SweepManifest, index: int, dependency: str | None = None,
               number: int | None = None) -> str:
    """Queue task `index` as its own heterogeneous job (its folder made the first time, kept for a
    resubmit); its job id, recorded in the task's run.json. `number`: its array log entry (Slurm)."""
    resolved = task_resolved(manifest, index)
    task = paths.task(index)
    mode = resolved.profile.run_mode
    if not task.record.exists():
        if not paths.tasks_dir.exists():
            perms.make_run_folder(paths.tasks_dir, mode)
        if not task.run_dir.exists():
            perms.make_run_folder(task.run_dir, mode)
        RunFile(task).create(task_record(paths, manifest, index))
    with RunFile(task).editing() as data:  # a new submission: earlier verdicts no longer apply
        data.final, data.failures = None, []
    code = RunPaths(paths.sweep_dir).code_dir
    place = Place(task, f"{manifest.sweep_id}/{index}", code if code.is_dir() else None,
                  {"SLURMKIT_SEED": str(manifest.tasks[index].seed)})
    request = build(resolved, task.job_folder, dependency=dependency)
    before = functools.partial(note_sbatch, paths, number) if number is not None else None
    job_id, script = queue(request, place, before_sbatch=before)
    recorded(task, resolved, job_id, script)
    return job_id


def submit_tasks(paths: SweepPaths, manifest: SweepManifest, indices: list[int],
                 kind: Literal["initial", "resubmit"], dependency: str | None = None) -> list[str]:
    """sbatch each task of `indices` as its own heterogeneous job, in order, each entry's job id
    recorded as soon as it exists; the job ids."""
    created = dt.datetime.now().isoformat(timespec="seconds")
    window = manifest.max_parallel
    ids: list[str] = []
    for k, index in enumerate(indices):
        with ArrayLog(paths).editing() as log:
            number = len(log.arrays)
            log.arrays.append(ArrayEntry(kind=kind, indices=[index], base=index, created=created, single=True))
        deps = [d for d in (dependency, f"afterany:{ids[k - window]}" if window and k >= window else None) if d]
        try:
            job_id = submit_one(paths, manifest, index, ",".join(deps) or None, number)
        except Exception as exc:
            detail = squash(str(exc))
            with ArrayLog(paths).editing() as log:
                log.arrays[number].error = detail
            if isinstance(exc, SlurmkitError) and not ids and kind == "initial":
                raise  # nothing queued: the submit removes the sweep
            raise SlurmError(f"task {index} failed to submit: {detail}", where=paths.sweep_id,
                             valid="it and the tasks after it show NOT_SUBMITTED; `slurmkit sweep resubmit "
                                   "SWEEP --failed` retries them") from exc
        with ArrayLog(paths).editing() as log:
            log.arrays[number].job_id = job_id
        ids.append(job_id)
    return ids
