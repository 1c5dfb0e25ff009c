"""Sweeps on the login node: listing and finding them under run_root, each task's newest array and
job id from the array log, and the manifest's resource groups rebuilt as Resolved. The sweep
folder's layout and its records are slurmkit.common.sweep_layout's."""

from __future__ import annotations

from slurmkit.common.sweep_layout import MANIFEST, ArrayEntry, SweepManifest, SweepPaths, task_spec
from slurmkit.config.loader import Resolved
from slurmkit.config.profile import ClusterProfile, Resources
from slurmkit.config.runspec import RunSpec
from slurmkit.runs.folders import find_folder, owned_folders


def newest_arrays(manifest: SweepManifest) -> dict[int, ArrayEntry | None]:
    """Each task's newest array entry (None if none holds it yet)."""
    newest: dict[int, ArrayEntry | None] = {t.index: None for t in manifest.tasks}
    for arr in manifest.arrays:
        if arr.job_id or arr.kind == "local":
            for index in arr.indices:
                newest[index] = arr
    return newest


def latest_job_ids(manifest: SweepManifest) -> dict[int, str | None]:
    """Each task's newest job id: ARRAY_TASK on Slurm, the controller pid on local; None before it exists."""
    latest: dict[int, str | None] = {}
    for index, arr in newest_arrays(manifest).items():
        if arr is None:
            latest[index] = None
        elif arr.kind == "local":
            latest[index] = arr.jobs.get(str(index))
        else:
            latest[index] = f"{arr.job_id}_{index - arr.base}"
    return latest


def list_sweeps(run_root: str) -> list[SweepPaths]:
    return [SweepPaths(d) for d in owned_folders(run_root, MANIFEST, "sweep")]


def find_sweep(run_root: str, sweep: str) -> SweepPaths:
    return SweepPaths(find_folder(run_root, sweep, MANIFEST, "sweep"))


def manifest_tasks(manifest: SweepManifest) -> tuple[list[Resolved], list[int]]:
    """(each resource group's Resolved, each task's group), rebuilt from the manifest: what was
    submitted, not today's files. A group's Resolved is that of its first task, as at submit."""
    prof = ClusterProfile.model_validate(manifest.profile)
    group_of = [t.group for t in manifest.tasks]
    first: dict[int, int] = {}
    for i, g in enumerate(group_of):
        first.setdefault(g, i)
    groups = [Resolved(RunSpec.model_validate(task_spec(manifest, first[g])), prof,
                       manifest.profile_name, Resources.model_validate(group.resources), manifest.source)
              for g, group in enumerate(manifest.groups)]
    return groups, group_of
