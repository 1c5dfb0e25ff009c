"""Submitting a sweep: write the manifest, then one job array per planned chunk (sweeps.plan);
resubmit failed tasks; cancel. Each array's job id is recorded in the manifest as soon as it
exists, so no task is ever dropped silently.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slurmkit.common import perms
from slurmkit.common.atomic import atomic_write_text
from slurmkit.common.layout import RunPaths, expand_checkpoint_root
from slurmkit.common.sweep_layout import (
    ArrayList,
    ArrayLog,
    Manifest,
    ManifestTask,
    ResourceGroup,
    SweepManifest,
    SweepPaths,
)
from slurmkit.config.profile import ClusterProfile
from slurmkit.errors import PreflightError
from slurmkit.jsontypes import JsonObject
from slurmkit.load.loader import load_profile, profile_name
from slurmkit.load.overrides import split_sets
from slurmkit.runs import registry
from slurmkit.runs.jobs import take_snapshot
from slurmkit.runs.procs import signal_process
from slurmkit.slurm import commands, preflight
from slurmkit.sweeps import hetjobs, local
from slurmkit.sweeps.arrays import cluster_limits, recover, submit_arrays
from slurmkit.sweeps.plan import plan_arrays
from slurmkit.sweeps.resolve import SweepTasks, resolve_tasks, search_base
from slurmkit.sweeps.search import begin
from slurmkit.sweeps.search_view import retry_failed, stop_driver
from slurmkit.sweeps.spec import SweepPlan, count
from slurmkit.sweeps.store import check_task_secrets, manifest_tasks

if TYPE_CHECKING:
    from slurmkit.runs.jobs import Call

# Final states after which `resubmit --failed` runs a task again.
RETRY_STATES = frozenset({"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                          "PREEMPTED", "NOT_SUBMITTED"})


@dataclass(frozen=True)
class SweepSubmitted:
    sweep_id: str
    sweep_dir: str
    tasks: int
    array_job_ids: list[str]

    def as_dict(self) -> JsonObject:
        return {"sweep_id": self.sweep_id, "tasks": self.tasks, "array_job_ids": self.array_job_ids,
                "sweep_dir": self.sweep_dir}


def create(plan: SweepPlan, tasks: SweepTasks) -> SweepPaths:
    """Write the manifest atomically, once; nothing is submitted yet."""
    prof = tasks.groups[0].profile
    created = registry.create(prof.run_root, f"{plan.name}-sweep", prof.run_mode, prof.checkpoint_root)
    paths = SweepPaths(created.run_dir)
    with registry.or_nothing(created, prof.checkpoint_root):
        _write_manifest(paths, plan, tasks)
    return paths


def _write_manifest(paths: SweepPaths, plan: SweepPlan, tasks: SweepTasks) -> None:
    """A task is its overrides, seed and resource group (plus its spec where the base cannot
    rebuild it): about 100 bytes, so 100,000 tasks are one write of about 10 MB."""
    first = tasks.groups[0]
    root = first.profile.checkpoint_root
    entries = [ManifestTask(index=i, overrides=overrides, seed=seed, group=group, spec=spec)
               for i, (overrides, seed, group, spec) in enumerate(zip(plan.overrides, tasks.seeds, tasks.group_of,
                                                                      tasks.specs, strict=True))]
    Manifest(paths).create(SweepManifest(
        sweep_id=paths.sweep_id, name=plan.name, source=plan.source,
        created=dt.datetime.now().isoformat(timespec="seconds"), executor=first.profile.executor,
        profile_name=first.profile_name, profile=first.profile.model_dump(), varying=plan.varying,
        max_parallel=plan.section.max_parallel, base_spec=tasks.base_spec, top=tasks.top,
        search=plan.section.search, prune=plan.section.prune, seed=plan.section.seed,
        groups=[ResourceGroup(resources=g.resources.model_dump(), num_tasks=g.shape.num_tasks) for g in tasks.groups],
        # Expanded once, here, as a plain run's is at submit: $VARS mean the login node's values.
        checkpoint_base=expand_checkpoint_root(root) if root else None, tasks=entries))
    ArrayLog(paths).create(ArrayList())


def submit(plan: SweepPlan, profile: str | None = None, sets: list[str] | None = None,
           max_array_size: int | None = None, after: str | None = None,
           loaded: ClusterProfile | None = None) -> SweepSubmitted:
    """Pre-flight, write the manifest, submit. max_array_size lowers the live MaxArraySize.
    `loaded`: the profile as the command already loaded it (its --set layers included).

    Everything created, here and by the jobs, gets the profile's run_mode umask (perms).
    """
    prof = loaded if loaded is not None else load_profile(profile_name(profile), split_sets(sets or [])[1])
    with perms.umask(prof.run_mode):
        return _submit(plan, profile, sets, max_array_size, after, prof)


def _submit(plan: SweepPlan, profile: str | None, sets: list[str] | None, max_array_size: int | None,
            after: str | None, prof: ClusterProfile) -> SweepSubmitted:
    n = count(plan.section)
    if prof.executor == "slurm":
        _, max_jobs = cluster_limits()
        if n > max_jobs:  # before resolving: a runaway spec is refused at once
            raise PreflightError(f"sweep of {n} tasks exceeds the cluster's MaxJobCount={max_jobs}",
                                 where=f"{plan.source}:sweep", valid=f"valid: at most {max_jobs} tasks")
    if plan.section.search is not None:
        return launch(plan, search_base(plan, profile, sets, prof), max_array_size, after)
    return launch(plan, resolve_tasks(plan, profile, sets, loaded=prof), max_array_size, after)


def launch(plan: SweepPlan, tasks: SweepTasks, max_array_size: int | None = None, after: str | None = None,
           prepare: Callable[[SweepPaths], None] | None = None, call: Call | None = None) -> SweepSubmitted:
    """Pre-flight, write the manifest (then `prepare` the folder: the function of a map_array),
    take the code snapshot if asked for (of `call`'s module folder outside git), and submit the
    arrays (on local: start the runner); a search, its first batch and its driver."""
    n = count(plan.section)
    first = tasks.groups[0]
    slurm = first.profile.executor == "slurm"
    if slurm:
        for group in tasks.groups:
            preflight.check(group)
        tasks = replace(tasks, groups=[preflight.avoid_blamed(g) for g in tasks.groups])
    paths = create(plan, tasks)
    with registry.or_nothing(RunPaths(paths.sweep_dir), first.profile.checkpoint_root):
        if prepare is not None:
            prepare(paths)

        if (snap := take_snapshot(first, paths.sweep_dir, call)) is not None:
            # Each task's run.json is made when it starts (sweep_layout.task_record), and carries this.
            atomic_write_text(paths.snapshot_record, json.dumps(snap), perms.file_mode(paths.sweep_dir))
    if not slurm and plan.section.search is None:
        local.start(paths, list(range(n)))
        return SweepSubmitted(paths.sweep_id, str(paths.sweep_dir), n, [])
    try:
        if plan.section.search is not None:  # its first batch now, the rest by its driver
            ids = begin(paths, plan.section.search, after)
        elif hetjobs.heterogeneous(manifest := Manifest(paths).read()):  # Slurm runs no hetjob in an array
            ids = hetjobs.submit_tasks(paths, manifest, list(range(n)), "initial", after)
        else:
            live_array, _ = cluster_limits()
            limit = min(max_array_size or live_array, live_array)
            arrays = plan_arrays(tasks.group_of, list(range(n)), limit, plan.section.max_parallel)
            ids = submit_arrays(paths, tasks.groups, arrays, "initial", after, plan.section.max_parallel)
    except BaseException:  # Ctrl-C in a large batch's ask too
        # Nothing queued (no array's job id, no local runner started): leave no sweep behind.
        if not any(a.job_id or a.runner_pid for a in ArrayLog(paths).read().arrays):
            registry.discard(RunPaths(paths.sweep_dir), first.profile.checkpoint_root)
        raise
    return SweepSubmitted(paths.sweep_id, str(paths.sweep_dir), n, ids)


def resubmit_failed(paths: SweepPaths, states: dict[int, str], max_array_size: int | None = None) -> list[int]:
    """One new array (per chunk) holding only the tasks that ended failed, cancelled or timed out.
    A search's failed trials go back to its study instead, as new trials (search_view.retry_failed)."""
    with perms.umask(perms.folder_kind(paths.sweep_dir)):
        return _resubmit(paths, states, max_array_size)


def _resubmit(paths: SweepPaths, states: dict[int, str], max_array_size: int | None) -> list[int]:
    manifest = Manifest(paths).read()
    if manifest.search is not None:
        return retry_failed(paths)  # its driver's start checks secret_env
    # An array whose submitter was killed inside sbatch: adopted if Slurm queued it (its tasks are
    # not NOT_SUBMITTED after all), else marked never queued (they are, and go again below).
    adopted = recover(paths) if manifest.executor == "slurm" else []
    queued = {i for n in adopted for i in ArrayLog(paths).read().arrays[n].indices}
    indices = sorted(i for i, st in states.items() if st in RETRY_STATES and i not in queued)
    if not indices:
        return []
    check_task_secrets(manifest, indices)
    if manifest.executor == "local":
        local.start(paths, indices)
        return indices
    if hetjobs.heterogeneous(manifest):
        hetjobs.submit_tasks(paths, manifest, indices, "resubmit")
        return indices
    groups, group_of = manifest_tasks(manifest)
    live_array, _ = cluster_limits()
    arrays = plan_arrays(group_of, indices, max_array_size or live_array, manifest.max_parallel)
    submit_arrays(paths, groups, arrays, "resubmit", None, manifest.max_parallel)
    return indices


def cancel(paths: SweepPaths) -> list[str]:
    """scancel every array of the sweep (local: stop the runner and every task's controller); a
    search's driver first, so that it asks no more."""
    manifest = Manifest(paths).read()
    if manifest.search is not None:
        stop_driver(paths)
        manifest = Manifest(paths).read()  # with any array it submitted before it stopped
    arrays = manifest.arrays
    if manifest.executor == "local":
        # Each pid with its recorded start time: a pid reused by another process is never signalled.
        procs: list[tuple[int | str | None, int | None]] = [(a.runner_pid, a.runner_start) for a in arrays]
        procs += [(jid, a.job_starts.get(i)) for a in arrays if a.kind == "local" for i, jid in a.jobs.items()]
        return [str(pid) for pid, start in procs if signal_process(pid, start)]

    ids = [a.job_id for a in arrays if a.job_id]
    if ids:
        commands.scancel(ids)
    return ids
