"""The job's shape: its nodes and tasks, read from resources here and nowhere else.

`resources.nodes`, `spare_nodes`, `elastic` and `tasks_per_node` become one typed value
(Resolved.shape); the #SBATCH header, submitit's task count, the supervisor's plan, pre-flight and
the cluster's limits all ask it (tests/unit/test_house_rules.py holds every other module to that).
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmkit.config.profile import Resources


@dataclass(frozen=True)
class Shape:
    nodes: int
    """The ranks' nodes (srun -N)."""
    spare_nodes: int
    """Nodes allocated beside them and kept idle, to take over a lost one."""
    tasks_per_node: int
    elastic: bool
    """The job goes on, on the nodes left, after a loss."""
    ray: bool
    """A Ray run: submitit starts one task (the driver) over all the nodes."""

    @classmethod
    def of(cls, resources: Resources, ray: bool = False) -> Shape:
        assert resources.nodes and resources.tasks_per_node
        return cls(resources.nodes, resources.spare_nodes or 0, resources.tasks_per_node, bool(resources.elastic), ray)

    @property
    def alloc_nodes(self) -> int:
        """Nodes the job allocates (sbatch --nodes): the ranks' nodes and the spares."""
        return self.nodes + self.spare_nodes

    @property
    def world(self) -> int:
        """Ranks in the job's torch.distributed world."""
        return self.nodes * self.tasks_per_node

    @property
    def num_tasks(self) -> int:
        """Processes submitit runs: every rank, or for Ray the one driver."""
        return 1 if self.ray else self.world

    @property
    def shrinks(self) -> bool:
        """The job outlives the loss of a node (--no-kill): a spare, or elastic, takes over."""
        return bool(self.spare_nodes or self.elastic)

    @property
    def least(self) -> int:
        """The fewest nodes a step may run on after losses: 1 if elastic, else all of them."""
        return 1 if self.elastic else self.nodes

    @property
    def asked(self) -> str:
        """The request in the spec's words, for an error line."""
        return f"nodes={self.nodes}" + (f" + spare_nodes={self.spare_nodes}" if self.spare_nodes else "")

    @property
    def where(self) -> str:
        """The field an error about the node count names."""
        return "resources.spare_nodes" if self.spare_nodes else "resources.nodes"
