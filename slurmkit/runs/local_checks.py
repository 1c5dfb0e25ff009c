"""What a local run asks of the machine it runs on, checked at submit: ranks and CPUs, GPUs, and
the trackers' packages."""

from __future__ import annotations

import os
from pathlib import Path

from slurmkit.config.resolved import Resolved
from slurmkit.errors import ConfigError, SlurmkitError, warn
from slurmkit.slurm import imports

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
"""One folder a GPU, made by NVIDIA's driver: counting them runs nothing (nvidia-smi takes ~0.1 s)."""


def check(resolved: Resolved, gpus_here: int | None = None) -> None:
    """A local run's request against this machine (gpus_here: this machine's GPUs, else counted)."""
    check_no_container(resolved)
    warn_oversubscribed(resolved)
    check_local_gpus(resolved, local_gpu_count() if gpus_here is None else gpus_here)
    for one in runs_of(resolved):
        imports.check_packages(one)


def check_no_container(resolved: Resolved) -> None:
    """The local executor starts every rank with this machine's interpreter: a container (the
    profile's, or a heterogeneous run's part's) would be left out without a word, so it is refused."""
    where = [(f"{resolved.spec_source}:components.{p.name}.container", p.resolved) for p in resolved.parts]
    for field, one in where or [(f"{resolved.profile_name}:container", resolved)]:
        if one.profile.container is not None:
            raise ConfigError("a container on the local executor (its ranks run on this machine)", where=field,
                              valid="valid: a Slurm profile for a container, or none here")


def runs_of(resolved: Resolved) -> list[Resolved]:
    """What runs on this machine: a heterogeneous run's every part (each its own ranks), else the run."""
    return [p.resolved for p in resolved.parts] or [resolved]


def local_gpu_count(root: Path = NVIDIA_GPUS) -> int:
    try:
        return sum(1 for _ in root.iterdir())
    except OSError:
        return 0


def check_local_gpus(resolved: Resolved, gpus_here: int) -> None:
    """A local run's ranks see the GPUs its resources ask for (submitit's local executor sets
    CUDA_VISIBLE_DEVICES to them, to none when none is asked): more than the machine has is refused,
    none of a GPU machine's for a train run is said."""
    asked = sum(one.node_gpus for one in runs_of(resolved))  # each part its own GPUs
    if asked > gpus_here:
        raise SlurmkitError(f"{asked} GPU(s) asked of a local run, and this machine has {gpus_here}",
                            where=f"{resolved.spec_source}:resources", valid=f"valid: at most {gpus_here}")
    if not asked and gpus_here and resolved.spec.task == "train":
        warn(f"{resolved.spec_source}:resources: no GPU asked, so the local ranks see none of this machine's "
             f"{gpus_here} and train on CPU; set resources.gpus_per_node={gpus_here}")


def warn_oversubscribed(resolved: Resolved) -> None:
    """A local run with more ranks than CPUs still runs, slowly: say so."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    tasks = sum(one.shape.num_tasks for one in runs_of(resolved))
    asked = sum(one.shape.num_tasks * (one.resources.cpus_per_task or 1) for one in runs_of(resolved))
    if asked > cpus:
        warn(f"{resolved.profile_name}: {tasks} local rank(s) asking {asked} CPU(s) "
             f"on {cpus} CPU(s); ranks will share cores")


def warn_idle_gpus(resolved: Resolved) -> None:
    """A train run drives one GPU a rank: fewer ranks a node than the node's GPUs leaves the rest idle
    (a spec's tasks_per_node undoing its profile's, as examples/train_gpt.yaml on gpu-pyxis)."""
    gpus, ranks = resolved.node_gpus, resolved.resources.tasks_per_node or 1
    if resolved.spec.task == "train" and gpus > ranks:
        warn(f"{resolved.spec_source}:resources.tasks_per_node={ranks} with {gpus} GPUs a node "
             f"({resolved.profile_name}): {gpus - ranks} GPU(s) a node idle; set resources.tasks_per_node={gpus}")
