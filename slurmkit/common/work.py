"""What a run runs, as a tagged union (Work): one of a run spec's kinds (config.runspec.KINDS),
typed, for the pickled Run (slurmkit.calls) to carry and the rank (worker.entry) to match on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slurmkit.common.code_source import source_of
from slurmkit.config.runspec import RunSpec
from slurmkit.jsontypes import JsonObject


@dataclass(frozen=True)
class TrainTask:
    """`task: train`: the built-in Trainer with its config."""

    task: str
    config: JsonObject


@dataclass(frozen=True)
class ShellCommand:
    """`command:`: a shell command every rank runs with bash -c."""

    command: str


@dataclass(frozen=True)
class RayDriver:
    """`ray:`: a driver script against a Ray cluster over the allocation (config.runspec.RaySpec, as data)."""

    ray: JsonObject


@dataclass(frozen=True)
class Target:
    """`callable: module:function`: imported on every rank and called with kwargs."""

    target: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class PythonFunction:
    """A `function` spec: slurmkit.Executor's Python function, pickled by value with its arguments."""

    fn: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    """The file the function's code names on the login side (common.code_source): its traceback
    on a rank names that file, not cloudpickle's <dynamic-code>."""


Work = TrainTask | ShellCommand | RayDriver | Target | PythonFunction
"""What a run runs: one of a run spec's kinds (config.runspec.KINDS), as a tagged union."""


def work_of(spec: RunSpec, fn: object = None, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Work:
    """The run spec's kind as its Work (`fn`, `args`, `kwargs`: a `function` spec's call)."""
    if spec.task is not None:
        return TrainTask(spec.task, spec.config)
    if spec.command is not None:
        return ShellCommand(spec.command)
    if spec.ray is not None:
        return RayDriver(spec.ray.model_dump())
    if spec.callable is not None:
        return Target(spec.callable, spec.kwargs)
    return PythonFunction(fn, args, dict(kwargs or {}), source_of(fn))
