"""The allocation the job's supervisor holds between two srun steps of the ranks: which of its nodes can
take the next step.

A job with spare nodes (resources.spare_nodes: sbatch --nodes=N+K --no-kill, srun -N N) or an
elastic one (resources.elastic: --no-kill, the next step on the nodes left) keeps its allocation
when a node fails. Slurm takes the failed node out of the job: scontrol's NodeList
shrinks, while the job's SLURM_JOB_NODELIST still names it, and the node itself may be
back IDLE at once (ReturnToService=2). So a lost node is one the job no longer holds, not one
sinfo calls down (measured on the dev cluster, 22.05). Read from Slurm by the decider's eyes
(supervisor.effects.read_allocation); the policy decides on it as data.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Allocation:
    started: tuple[str, ...]
    """The job's nodes as it started (SLURM_JOB_NODELIST)."""
    held: tuple[str, ...]
    """The nodes it holds now."""
    unusable: tuple[str, ...]
    """Held nodes that cannot run a step (down, drained, not responding)."""
    needed: int
    """Nodes the last step of the ranks ran on: the next takes as many where it can."""
    least: int | None = None
    """The fewest nodes the next step may run on (elastic: 1); None: `needed`."""

    @property
    def lost(self) -> list[str]:
        return [n for n in self.started if n not in self.held]

    @property
    def healthy(self) -> list[str]:
        return [n for n in self.held if n not in self.unusable]

    @property
    def fits(self) -> bool:
        """Whether a new step of the ranks can start here."""
        return len(self.healthy) >= (self.needed if self.least is None else self.least)

    @property
    def step_nodes(self) -> int:
        """Nodes the next step runs on: as many as before, fewer only where elastic allows."""
        return min(self.needed, len(self.healthy))

    def without(self, node: str) -> Allocation:
        """This allocation with `node` left out of every later step (a straggler's, replaced)."""
        return replace(self, unusable=self.unusable if node in self.unusable else (*self.unusable, node))
