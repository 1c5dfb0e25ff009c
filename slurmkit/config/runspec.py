"""The run spec: what to run, and with which resources."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from slurmkit.config.fields import EnvMap, EnvNames, Strict
from slurmkit.config.profile import Resources
from slurmkit.config.ray import RaySpec
from slurmkit.config.slurm_args import SbatchArgs, SrunArgs
from slurmkit.config.text import clip
from slurmkit.config.tracking import Tracking

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
TASKS = ("train",)
KINDS = ("command", "callable", "function", "task", "ray")


class RunSpec(Strict):
    """One run: exactly one of command, callable, function, task or ray, plus resources."""

    multiline_fields = frozenset({"command", "kwargs", "config"})

    name: str
    """Run name; letters, digits, '.', '_' and '-'. It prefixes the run id and is the Slurm job name."""
    command: str | None = None
    """A shell command run by every rank with bash -c."""
    callable: str | None = None
    """A Python callable as module:function, called on every rank with kwargs; rank 0's return is the result."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for callable (and a search's function: its trial's params, slurmkit.sweep)."""
    function: str | None = None
    """Set only by slurmkit.Executor.submit/map_array: the name of the Python function carried by value in the
    job's pickle (e.g. __main__.train), shown by status and the report. A spec file names a callable instead."""
    task: str | None = None
    """A built-in task: train."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Configuration of the built-in task."""
    ray: RaySpec | None = None
    """A Ray cluster over the allocation (one Ray node per Slurm node) and a driver script run against it."""
    resources: Resources = Field(default_factory=lambda: Resources())
    """Resources of this run; unset fields come from the profile, then the defaults."""
    env: EnvMap = Field(default_factory=dict)
    """Environment variables for the ranks (values quoted in the script)."""
    srun_args: SrunArgs = Field(default_factory=list)
    """srun options for this run's ranks, after the profile's srun_args (docs/profiles.md)."""
    sbatch_args: SbatchArgs = Field(default_factory=dict)
    """sbatch options for this run, replacing the profile's sbatch_args of the same name (docs/profiles.md)."""
    secret_env: EnvNames = Field(default_factory=list)
    """Names of variables (API keys, passwords) the ranks get from the environment `submit` runs in, as
    Slurm carries a job's environment: their values are never written to run.json, the script, the
    job's pickle or a tracker (docs/security.md). Each must be set at submit."""
    snapshot: bool | None = None
    """Copy the code into the run folder at submit and run from that copy, requeues included; unset takes the
    profile's snapshot."""
    launcher: Literal["srun", "torchrun"] = "srun"
    """How ranks start: srun, one task per rank; or torchrun, one per node (an srun task) starting
    tasks_per_node ranks with the c10d rendezvous on the first node (docs/training.md). Slurm profiles only."""
    tracking: Tracking | None = None
    """Experiment trackers for this run; replaces the profile's `tracking` (docs/tracking.md)."""

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                f"invalid name {clip(v)}; valid: 1-64 of letters, digits, '.', '_', '-', starting with a letter "
                "or digit"
            )
        return v

    @field_validator("callable")
    @classmethod
    def _callable_shape(cls, v: str | None) -> str | None:
        if v is not None and not _CALLABLE_RE.match(v):
            raise ValueError(f"invalid callable {clip(v)}; valid: module.path:function")
        return v

    @field_validator("task")
    @classmethod
    def _known_task(cls, v: str | None) -> str | None:
        if v is not None and v not in TASKS:
            raise ValueError(f"unknown task {clip(v)}; valid: {', '.join(TASKS)}")
        return v

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> RunSpec:
        given = [k for k in KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"exactly one of {', '.join(KINDS)} is needed, got {', '.join(given) or 'none'}")
        if self.kwargs and self.callable is None and self.function is None:
            raise ValueError("kwargs is only valid with callable (or a search's function)")
        if self.config and self.task is None:
            raise ValueError("config is only valid with task")
        if self.launcher == "torchrun" and self.ray is not None:
            raise ValueError("launcher torchrun is not valid with ray (Ray starts its own processes); valid: srun")
        if given_both := sorted(set(self.secret_env) & set(self.env)):
            raise ValueError(f"secret_env {', '.join(given_both)} also has a value in env, which would be written "
                             "down; valid: export it before submitting and leave it out of env")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) is not None)
