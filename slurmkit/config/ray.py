"""`ray:` in a run spec: a Ray cluster inside the Slurm allocation, and a driver script run against it."""

from __future__ import annotations

from pydantic import Field

from slurmkit.config.fields import Strict


class RaySpec(Strict):
    """The head starts on the first node, a worker on every other; the driver runs once the cluster is whole."""

    driver: str = Field(min_length=1)
    """Python script run as __main__ against the Ray cluster (RAY_ADDRESS is set); relative to the spec file.
    A module-level `result` becomes the run's result."""
    args: list[str] = Field(default_factory=list)
    """Arguments for the driver (its sys.argv[1:])."""
    start_timeout_s: float = Field(120.0, gt=0)
    """How long to wait for every node to join the Ray cluster before failing with the nodes that are missing."""
    object_store_mb: int | None = Field(None, ge=64)
    """Object store per node; unset: 30% of the job's memory per node (--mem, else 4096 MB)."""
