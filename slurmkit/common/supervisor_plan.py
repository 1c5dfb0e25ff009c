"""The supervisor's plan: what the job's supervisor (slurmkit.supervisor.loop) runs, rendered at
submit into the batch script (as JSON on its command line, and as comments for people).

Written by render (the login side), read by the supervisor (the job's side): the one format both
sides share for how the ranks are launched.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Shrink(_Frozen):
    """A job that keeps its allocation when a node fails (spare nodes, or elastic)."""

    nodes: int
    """Nodes each step of the ranks runs on (the job holds more where it has spares)."""
    least: int
    """The fewest nodes a step may run on: 1 when elastic, else `nodes`."""


class Health(_Frozen):
    """The health gate: one check per node before any rank starts."""

    python: list[str]
    """The host's interpreter (and -P) that runs slurmkit.worker.health on each node."""
    gpus: int
    """GPUs each node must show."""
    allreduce: bool
    """Also one small all-reduce across the nodes."""


class PartPlan(_Frozen):
    """One part of a heterogeneous job (spec components): its own srun step, `--het-group=N` (N: its
    index in Plan.parts), in its own run folder."""

    name: str
    run_dir: str
    """The part's run folder (the run's own for the primary part, else parts/NAME)."""
    command: list[str]
    stdout: str
    stderr: str
    tasks_per_node: int
    nodes: int = 1
    """Its nodes (the local profile runs nodes x tasks_per_node ranks on this machine, as for any local run)."""
    srun_args: list[str] = []
    gpus_per_node: int = 0
    """Its GPUs a node (the local profile hands each part its own of the machine's, in part order)."""
    primary: bool = False
    """The part whose result is the run's: once it has completed, the job has."""


class Plan(_Frozen):
    signal: str
    """The profile's signal name (USR2): Slurm sends it to the supervisor, which passes it to the ranks' step."""
    launcher: Literal["srun", "torchrun"]
    """srun: one rank per srun task; torchrun: one torchrun per node starting that node's ranks."""
    command: list[str]
    """srun: each rank's argv; torchrun: each node's argv (a `bash -c` that starts torchrun)."""
    stdout: str
    """srun --output of the ranks' step (Slurm's %j/%t patterns)."""
    stderr: str
    tasks_per_node: int
    in_job: int
    """The profile's requeue.in_job: in-job restarts per incarnation."""
    budgets: dict[str, int]
    """The profile's requeue budgets by cause (for people; run.json's copy is the one that counts)."""
    srun_args: list[str] = []
    """The profile's and spec's srun_args: on the ranks' step and the standby's, before the command."""
    standby: list[str] | None = None
    """The standby ranks' argv (slurmkit.worker.standby; the supervisor adds --run-dir and --attempt)."""
    shrink: Shrink | None = None
    health: Health | None = None
    staged_from: str | None = None
    """The interpreter the batch shell staged to the nodes' local disks (profile stage.env): in every
    step's argv it is the staged copy (SLURMKIT_STAGED_PYTHON) instead."""
    parts: list[PartPlan] = []
    """A heterogeneous job's parts, in het-group order (supervisor.parts runs them); [] for any other job."""

    def part(self, group: int) -> Plan:
        """The plan of part `group`'s step: its command, logs and srun options, no standby or gate."""
        p = self.parts[group]
        return self.model_copy(update={"command": p.command, "stdout": p.stdout, "stderr": p.stderr,
                                       "tasks_per_node": p.tasks_per_node, "srun_args": p.srun_args,
                                       "standby": None, "health": None, "shrink": None, "parts": []})

    def describe(self) -> list[str]:
        """The plan in a few lines for the batch script's comments."""
        if self.parts:
            names = ", ".join(f"{p.name} (--het-group={i}, {p.tasks_per_node} rank(s) per node)"
                              for i, p in enumerate(self.parts))
            lines = [f"a heterogeneous job: one srun step per part, each its own world: {names}",
                     f"the job has completed once {next(p.name for p in self.parts if p.primary)} has; a signal "
                     "goes to every part, and a part that fails is decided by the restart policy"]
        else:
            lines = [f"launcher: {self.launcher}, {self.tasks_per_node} rank(s) per node"
                     + (" (one torchrun per node)" if self.launcher == "torchrun" else "")]
        if self.health:
            lines.append(f"health gate first: {self.health.gpus} GPU(s) per node"
                         + (", and an all-reduce across the nodes" if self.health.allreduce else ""))
        lines.append(("each attempt: one srun step of the ranks" if not self.parts else
                      "each attempt of a part: one srun step of its ranks")
                     + (f" on {self.shrink.nodes} node(s), at least {self.shrink.least} after a loss"
                        if self.shrink else "")
                     + ("; beside it a standby step that takes the next attempt" if self.standby else ""))
        budgets = ", ".join(f"{k} {v}" for k, v in sorted(self.budgets.items()))
        lines.append(f"after a failure the restart policy decides: {self.in_job} in-job restart(s) per "
                     f"incarnation; requeue budgets: {budgets}")
        if self.staged_from:
            lines.append("the environment is staged to each node's local disk first; every step runs its copy")
        lines.append(f"SIG{self.signal} is passed to the ranks' step; the supervisor exits with the step's status")
        return lines
