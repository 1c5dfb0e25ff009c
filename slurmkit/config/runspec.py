"""The run spec: what to run, and with which resources."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from slurmkit.config.container import Container
from slurmkit.config.fields import EnvMap, EnvNames, Strict
from slurmkit.config.profile import Resources
from slurmkit.config.ray import RaySpec
from slurmkit.config.slurm_args import SbatchArgs, SrunArgs
from slurmkit.config.text import clip
from slurmkit.config.tracking import Tracking

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_PART_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
TASKS = ("train",)
KINDS = ("command", "callable", "function", "task", "ray")
PART_KINDS = ("command", "callable", "function", "task")


def _callable_shape(v: str | None) -> str | None:
    if v is not None and not _CALLABLE_RE.match(v):
        raise ValueError(f"invalid callable {clip(v)}; valid: module.path:function")
    return v


def _known_task(v: str | None) -> str | None:
    if v is not None and v not in TASKS:
        raise ValueError(f"unknown task {clip(v)}; valid: {', '.join(TASKS)}")
    return v


class Component(Strict):
    """One part of a heterogeneous run (RunSpec.components): its own Slurm het component, its own
    torch.distributed world (docs/heterogeneous.md)."""

    multiline_fields = frozenset({"command", "kwargs", "config"})

    command: str | None = None
    """A shell command run by every rank of this part with bash -c."""
    callable: str | None = None
    """A Python callable as module:function, called on every rank of this part with kwargs."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for callable."""
    function: str | None = None
    """Set only by slurmkit.Executor.submit_components: the name of the Python function carried by
    value in this part's pickle. A spec file names a callable instead."""
    task: str | None = None
    """A built-in task: train."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Configuration of the built-in task."""
    resources: Resources = Field(default_factory=lambda: Resources())
    """This part's resources, over the run's top-level resources (time, ...), then the profile's."""
    env: EnvMap = Field(default_factory=dict)
    """Environment variables for this part's ranks, over the run's top-level env."""
    srun_args: SrunArgs = Field(default_factory=list)
    """srun options for this part's ranks, after the profile's and the run's srun_args."""
    container: Container | None = None
    """This part's container, in place of the profile's (the profile's `container` fields: runtime,
    image, mounts, ...); unset: the profile's, if it has one."""

    _callable = field_validator("callable")(_callable_shape)
    _task = field_validator("task")(_known_task)

    @model_validator(mode="after")
    def _one_kind(self) -> Component:
        given = [k for k in PART_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"exactly one of {', '.join(PART_KINDS)} is needed in a part, got "
                             f"{', '.join(given) or 'none'}")
        if self.kwargs and self.callable is None and self.function is None:
            raise ValueError("kwargs is only valid with callable")
        if self.config and self.task is None:
            raise ValueError("config is only valid with task")
        return self


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
    components: dict[str, Component] | None = None
    """A heterogeneous run: part name -> part, instead of a top-level command, callable or task. All parts
    run in one Slurm heterogeneous job, each as its own component with its own resources and its own
    torch.distributed world; top-level resources (time), env, srun_args, tracking and the requeue
    budgets apply to every part. A name is a valid environment variable name (SLURMKIT_<NAME>_HOST)."""
    result: str | None = None
    """With components: the part whose rank 0's return is the run's result, and whose ranks' files are
    the run folder's own (the others' are under parts/NAME/); the first part by default."""

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                f"invalid name {clip(v)}; valid: 1-64 of letters, digits, '.', '_', '-', starting with a letter "
                "or digit"
            )
        return v

    _callable = field_validator("callable")(_callable_shape)
    _task = field_validator("task")(_known_task)

    @field_validator("components")
    @classmethod
    def _part_names(cls, v: dict[str, Component] | None) -> dict[str, Component] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("no parts; valid: one or more `NAME: {command: ...}`")
        for name in v:
            if not _PART_RE.match(name):
                raise ValueError(f"part name {clip(name)} is not a valid environment variable name; valid: 1-32 "
                                 "letters, digits and '_', not starting with a digit")
        upper = [n.upper() for n in v]
        if clash := sorted({n for n in v if upper.count(n.upper()) > 1}):
            raise ValueError(f"part names {', '.join(clash)} differ only in case (SLURMKIT_<NAME>_HOST is upper "
                             "case); valid: names that differ in letters")
        return v

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> RunSpec:
        given = [k for k in KINDS if getattr(self, k) is not None]
        if self.components is not None:
            return self._parts_alone(given)
        if self.result is not None:
            raise ValueError("result names a part, and is only valid with components")
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

    def _parts_alone(self, given: list[str]) -> RunSpec:
        """components is the whole of what a heterogeneous run runs: no top-level kind beside it."""
        assert self.components is not None
        if given:
            raise ValueError(f"components together with a top-level {given[0]}; valid: the {given[0]} inside a part "
                             "(components: {NAME: {" + given[0] + ": ...}})")
        if self.kwargs or self.config:
            raise ValueError(f"top-level {'kwargs' if self.kwargs else 'config'} with components; valid: inside a part")
        if self.launcher != "srun":
            raise ValueError("launcher torchrun with components; valid: srun (each part is one srun step)")
        if self.result is not None and self.result not in self.components:
            raise ValueError(f"result {clip(self.result)} is not a part; valid: {', '.join(self.components)}")
        return self

    @property
    def kind(self) -> str:
        if self.components is not None:
            return "components"
        return next(k for k in KINDS if getattr(self, k) is not None)

    def part(self, name: str) -> RunSpec:
        """Part `name` of a heterogeneous run as a one-kind run spec: the run's env, srun_args, tracking
        and snapshot under the part's own (its resources are layered by load.loader.resolve_layers)."""
        assert self.components is not None
        c = self.components[name]
        return RunSpec(name=self.name, command=c.command, callable=c.callable, kwargs=c.kwargs, function=c.function,
                       task=c.task, config=c.config, resources=c.resources, env={**self.env, **c.env},
                       srun_args=[*self.srun_args, *c.srun_args], sbatch_args=self.sbatch_args,
                       secret_env=self.secret_env, snapshot=self.snapshot, tracking=self.tracking)

    @property
    def primary(self) -> str | None:
        """With components: the part whose result is the run's (result, else the first)."""
        return None if self.components is None else self.result or next(iter(self.components))
