"""A run spec and profile after every layer is merged (slurmkit.load.loader.resolve makes it)."""

from __future__ import annotations

from dataclasses import dataclass

from slurmkit.config.fields import node_gpus
from slurmkit.config.profile import ClusterProfile, Resources
from slurmkit.config.runspec import RunSpec
from slurmkit.config.shape import Shape
from slurmkit.config.tracking import Tracking


@dataclass(frozen=True)
class Resolved:
    """A run spec and profile after all layers are merged; resources has every field set."""

    spec: RunSpec
    profile: ClusterProfile
    profile_name: str
    resources: Resources
    spec_source: str
    parts: tuple[ResolvedPart, ...] = ()
    """A heterogeneous run's parts (spec.components), each resolved as a run of its own; () for any
    other run. The run's own resources (so its shape, num_tasks and logs) are its primary part's."""

    @property
    def shape(self) -> Shape:
        """The job's nodes and tasks (config.shape: the one reading of the node count)."""
        return Shape.of(self.resources, bool(self.spec.ray))

    @property
    def node_gpus(self) -> int:
        """GPUs each node gets, however resources ask for them: gpus_per_node, gpus_per_task x
        tasks_per_node, or a gpu gres. The health gate, container GPU flags, pre-flight and Ray use it."""
        r = self.resources
        return node_gpus(r.gpus_per_node, r.gpus_per_task, r.tasks_per_node, r.gres)

    @property
    def tracking(self) -> Tracking | None:
        """The trackers the run logs to: the spec's, else the profile's."""
        return self.spec.tracking or self.profile.tracking

    @property
    def snapshot(self) -> bool:
        """Whether the code is copied into the run folder: the spec's choice, else the profile's."""
        return self.profile.snapshot if self.spec.snapshot is None else self.spec.snapshot

    @property
    def srun_args(self) -> list[str]:
        """The ranks' extra srun options: the profile's, then the spec's (srun takes the last of two)."""
        return [*self.profile.srun_args, *self.spec.srun_args]

    @property
    def sbatch_args(self) -> dict[str, str | int | bool]:
        """The job's extra sbatch options: the profile's, each replaced by the spec's of the same name."""
        return {**self.profile.sbatch_args, **self.spec.sbatch_args}


@dataclass(frozen=True)
class ResolvedPart:
    """One part of a heterogeneous run (spec components), resolved as a run of its own (load.loader)."""

    name: str
    group: int
    """The part's het group (its index in components): `srun --het-group=N`, SLURM_*_HET_GROUP_N."""
    resolved: Resolved
    primary: bool

    def run_id(self, top_id: str) -> str:
        """The part's run id (trackers, checkpoint_root keys): the run's own, or RUN.NAME."""
        return top_id if self.primary else f"{top_id}.{self.name}"
