"""What a run cost: node-hours and GPU-hours from accounting's incarnations (requeues summed), and
the part of them that was lost, as the goodput accounting splits the run's time (slurmkit.insight.goodput)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from slurmkit.common.slurm_env import expand_hostlist
from slurmkit.config.fields import node_gpus
from slurmkit.config.profile import Resources
from slurmkit.slurm.parse import Incarnation


@dataclass(frozen=True)
class Cost:
    node_hours: float
    """Every incarnation's running time (start to end, as sacct has it) times its nodes, summed."""
    gpu_hours: float
    """node_hours times the GPUs each node was given (0 on a CPU run)."""
    lost_node_hours: float
    """Node-hours held but not spent on steps that count: start-up and restarts, steps run again,
    checkpoint stalls, the rest of each incarnation's time outside its steps."""

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in asdict(self).items()}


def gpus_per_node(resources: Resources) -> int:
    """From run.json's resources (as validated at submit)."""
    return node_gpus(resources.gpus_per_node, resources.gpus_per_task, resources.tasks_per_node, resources.gres)


def of_run(incs: list[Incarnation], gpus: int, productive_s: float) -> Cost:
    """The cost of the incarnations that ran; `productive_s`: the goodput's productive step time."""
    held = [(i.end - i.start, len(expand_hostlist(i.nodes)) or 1) for i in incs
            if i.start is not None and i.end is not None and i.end > i.start]
    node_s = sum(seconds * nodes for seconds, nodes in held)
    run_s = sum(seconds for seconds, _ in held)
    # Productive time was spent on every node the run held then: its node-seconds at the mean node count.
    productive_node_s = min(node_s, productive_s * node_s / run_s) if run_s else 0.0
    return Cost(node_s / 3600, node_s * gpus / 3600, (node_s - productive_node_s) / 3600)
