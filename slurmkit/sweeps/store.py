"""The manifest's resource groups rebuilt as Resolved, on the login node. Listing and finding sweeps
is slurmkit.runs.folders's; the sweep folder's layout, its records and what they say (each task's
newest array and job id) are slurmkit.common.sweep_layout's."""

from __future__ import annotations

from slurmkit.common.sweep_layout import SweepManifest, task_spec
from slurmkit.config.loader import Resolved
from slurmkit.config.profile import ClusterProfile, Resources
from slurmkit.config.runspec import RunSpec


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
