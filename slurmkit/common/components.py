"""Where a heterogeneous job's parts are: the variables every rank gets, and `slurmkit.components()`.

The job's supervisor (supervisor.parts) reads each part's nodes from Slurm's
SLURM_JOB_NODELIST_HET_GROUP_N in the batch step and gives every part's step, for every part NAME
(upper case): SLURMKIT_<NAME>_HOST (its first node) and SLURMKIT_<NAME>_NODES (its nodes, comma
separated); SLURMKIT_COMPONENTS (the part names, in het-group order) and SLURMKIT_COMPONENT (the
rank's own part).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from slurmkit.common.slurm_env import expand_hostlist

COMPONENTS_ENV = "SLURMKIT_COMPONENTS"
COMPONENT_ENV = "SLURMKIT_COMPONENT"


@dataclass(frozen=True)
class Component:
    """One part of the heterogeneous job this rank belongs to."""

    name: str
    group: int
    """Its het group: `srun --het-group=N`, Slurm's *_HET_GROUP_N variables."""
    host: str
    """Its first node: where its rank 0 runs (a server of the part's listens there)."""
    nodes: tuple[str, ...]
    mine: bool
    """This rank's own part."""


def host_var(name: str) -> str:
    return f"SLURMKIT_{name.upper()}_HOST"


def nodes_var(name: str) -> str:
    return f"SLURMKIT_{name.upper()}_NODES"


def variables(names: list[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables every part's step gets, from the batch step's Slurm environment (its
    SLURM_JOB_NODELIST_HET_GROUP_N, N the index in `names`)."""
    found = {COMPONENTS_ENV: ",".join(names)}
    for group, name in enumerate(names):
        nodes = expand_hostlist(environ.get(f"SLURM_JOB_NODELIST_HET_GROUP_{group}", ""))
        found[host_var(name)] = nodes[0] if nodes else ""
        found[nodes_var(name)] = ",".join(nodes)
    return found


LOCAL_HOST = "127.0.0.1"
"""Every part's host on the local profile: one machine, reached the same way from every part."""


def local_variables(names: list[str]) -> dict[str, str]:
    """The variables every part gets on the local profile (supervisor.local_parts): all on this machine."""
    return {COMPONENTS_ENV: ",".join(names), **{host_var(n): LOCAL_HOST for n in names},
            **{nodes_var(n): LOCAL_HOST for n in names}}


def components(environ: Mapping[str, str] | None = None) -> dict[str, Component]:
    """The parts of the heterogeneous job this process runs in, by name, in het-group order; {}
    outside one (a run without components)."""
    env = os.environ if environ is None else environ
    names = [n for n in env.get(COMPONENTS_ENV, "").split(",") if n]
    mine = env.get(COMPONENT_ENV)
    return {name: Component(name, group, env.get(host_var(name), ""),
                            tuple(n for n in env.get(nodes_var(name), "").split(",") if n), name == mine)
            for group, name in enumerate(names)}
