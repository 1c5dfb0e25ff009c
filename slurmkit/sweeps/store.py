"""The manifest's resource groups rebuilt as Resolved, on the login node. Listing and finding sweeps
is slurmkit.runs.folders's; the sweep folder's layout, its records and what they say (each task's
newest array and job id) are slurmkit.common.sweep_layout's."""

from __future__ import annotations

from slurmkit.common.sweep_layout import SweepManifest, task_spec
from slurmkit.config.profile import ClusterProfile, Resources
from slurmkit.config.resolved import Resolved
from slurmkit.config.runspec import RunSpec
from slurmkit.runs.jobs.submit import check_secrets


def manifest_tasks(manifest: SweepManifest) -> tuple[list[Resolved], list[int]]:
    """(each resource group's Resolved, each task's group), rebuilt from the manifest: what was
    submitted, not today's files. A group's Resolved is that of its first task, as at submit."""
    prof = ClusterProfile.model_validate(manifest.profile)
    group_of = [t.group for t in manifest.tasks]
    first: dict[int, int] = {}
    for t in manifest.tasks:
        if t.invalid is None:  # a search's trial the spec refused has no spec to show
            first.setdefault(t.group, t.index)
    groups = [Resolved(RunSpec.model_validate(task_spec(manifest, first[g]) if g in first else manifest.base_spec),
                       prof, manifest.profile_name, Resources.model_validate(group.resources), manifest.source)
              for g, group in enumerate(manifest.groups)]
    return groups, group_of


def check_task_secrets(manifest: SweepManifest, indices: list[int]) -> None:
    """The secret_env of the tasks about to run again (`sweep resume`, `resubmit --failed`) is set
    here, as a submit checks it: a task started without its secret would fail later, in the queue.
    A search's trials share its base spec's."""
    specs = [manifest.base_spec or {}] if manifest.search is not None else [
        task_spec(manifest, i) for i in indices if manifest.tasks[i].invalid is None]
    names = sorted({n for spec in specs for n in spec.get("secret_env") or []})
    container = manifest.profile.get("container") or {}
    check_secrets(names, manifest.source, {**manifest.profile["setup"]["env"], **(container.get("env") or {})})
