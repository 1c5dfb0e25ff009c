"""The Python API: Executor.submit / map_array and slurmkit.sweep, over the same library as the CLI.

    ex = slurmkit.Executor(profile="devcluster", nodes=2, time="00:10:00")
    job = ex.submit(fn, *args, **kwargs)      # a slurmkit.Job (slurmkit.api.handles)

Keyword arguments are the run's resources (nodes, tasks_per_node, gpus_per_node, cpus_per_task,
mem, time) and any profile field (partition, account, requeue, signal_delay_s, ...), validated as
the CLI validates them, with the same one-line errors. Precedence, highest first: `set=[...]`
> keyword arguments > the profile > the defaults. Torch is never imported here.
"""

from __future__ import annotations

import inspect
import re
import shlex
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmkit.api import mapped, submitit_names
from slurmkit.api.handles import Job, SearchHandle, SweepHandle
from slurmkit.common.sweep_layout import SweepPaths
from slurmkit.config.profile import ClusterProfile, Resources
from slurmkit.config.resolved import Resolved
from slurmkit.errors import ConfigError, did_you_mean, squash
from slurmkit.jsontypes import JsonObject
from slurmkit.load.loader import (
    Layer,
    load_profile,
    profile_layers,
    profile_name,
    resolve_layers,
    validate_layers,
)
from slurmkit.load.overrides import split_sets
from slurmkit.remote import api as remote_api
from slurmkit.remote.forward import site_of
from slurmkit.runs import jobs
from slurmkit.sweeps import spec as sweep_spec
from slurmkit.sweeps.submit import submit

SOURCE = "Executor"
RESOURCE_FIELDS = tuple(Resources.model_fields)
SPEC_FIELDS = ("name", "env", "snapshot", "launcher")
PREFLIGHT_TTL_S = 60.0
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _name_of(fn: Callable[..., Any]) -> str:
    """A run name from a function: `<lambda>` -> lambda; a name Slurm and the run id accept."""
    name = _UNSAFE_NAME.sub("", getattr(fn, "__name__", "") or "") or "function"
    return name[:64].lstrip("._-") or "function"


def _qualified(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', None) or type(fn).__name__}"


def _installed(path: str) -> bool:
    """A module file of the standard library or of an installed package: the nodes import it too."""
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(Path(path).resolve().is_relative_to(Path(r).resolve()) for r in roots)


def by_value(fn: Callable[..., Any]) -> None:
    """Send the function's module by value unless the nodes can import it: cloudpickle pickles
    `__main__` (scripts, notebooks) by value already; a module that exists only in the login
    node's working directory is registered so too, an installed package stays by reference."""
    import cloudpickle

    top = (getattr(fn, "__module__", None) or "").split(".")[0]
    module = sys.modules.get(top)
    path = getattr(module, "__file__", None)
    if module is None or top in ("__main__", "slurmkit") or path is None or _installed(path):
        return
    cloudpickle.register_pickle_by_value(module)


def check_call(call: jobs.Call) -> None:
    """At submit, never after queueing: the call pickles, and its return value can come back."""
    import cloudpickle

    fn = call.fn
    if not callable(fn):
        raise ConfigError(f"{type(fn).__name__} object is not callable", where=f"{SOURCE}.submit",
                          valid="valid: a function, lambda, or callable object")
    for kind, test in (("generator", inspect.isgeneratorfunction), ("coroutine", inspect.iscoroutinefunction),
                       ("async generator", inspect.isasyncgenfunction)):
        if test(fn):
            raise ConfigError(f"{_qualified(fn)} returns a {kind}, which cannot be sent back from the job",
                              where=f"{SOURCE}.submit", valid="valid: a function that returns its values")
    by_value(fn)
    try:
        cloudpickle.dumps(call)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to see, in one line
        raise ConfigError(f"{_qualified(fn)} or its arguments do not pickle: {type(exc).__name__}: "
                          f"{squash(str(exc), 200)}", where=f"{SOURCE}.submit",
                          valid="valid: a function whose globals and arguments pickle (no open files, locks, "
                                "sockets or live connections)") from None


class Part:
    """One part of Executor.submit_components: a function, called as run(*args, **kwargs) on every
    rank of the part, or a shell command (a `command:` part); with the part's own resources (nodes,
    tasks_per_node, gpus_per_node, ...) and env over the executor's."""

    def __init__(self, run: Callable[..., Any] | str, *args: Any, resources: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, **kwargs: Any) -> None:
        self.run, self.args, self.kwargs = run, args, kwargs
        self.resources, self.env = resources or {}, env or {}

    def component(self) -> tuple[JsonObject, jobs.Call | None]:
        """The part as a spec's component, and its call where it is a function (checked to pickle)."""
        own: JsonObject = {k: v for k, v in (("resources", self.resources), ("env", self.env)) if v}
        if isinstance(self.run, str):
            return {"command": self.run, **own}, None
        call = jobs.Call(self.run, self.args, self.kwargs)
        check_call(call)
        return {"function": _qualified(self.run), **own}, call


class Executor:
    """Submits Python functions as slurmkit runs: profiles, rendered scripts, pre-flight, requeue,
    run folders; `slurmkit status/logs/result/cancel/report` work on what it submits."""

    def __init__(self, profile: str | None = None, *, name: str | None = None, env: dict[str, str] | None = None,
                 set: list[str] | None = None, snapshot: bool | None = None, launcher: str | None = None,
                 max_parallel: int | None = None, **fields: Any) -> None:
        self._kw: JsonObject = {"name": name, "env": env, "set": set, "snapshot": snapshot, "launcher": launcher,
                                    "max_parallel": max_parallel, **fields}
        self.max_parallel = max_parallel
        """map_array's throttle where its call names none (submitit's slurm_array_parallelism)."""
        self.profile_name = profile_name(profile)
        unknown = [k for k in fields if k not in RESOURCE_FIELDS and k not in ClusterProfile.model_fields]
        if unknown:
            valid = [*RESOURCE_FIELDS, *SPEC_FIELDS, "set", *ClusterProfile.model_fields]
            if hint := submitit_names.keyword_hint(unknown[0], valid):
                raise ConfigError(f"unknown keyword argument {unknown[0]!r}: that is submitit's; slurmkit's is {hint}",
                                  where=SOURCE, valid="each submitit name and its slurmkit form: docs/from-submitit.md")
            raise ConfigError(f"unknown keyword argument {unknown[0]!r}{did_you_mean(unknown[0], valid)}",
                              where=SOURCE, valid=f"valid: {', '.join(valid)}")
        spec_sets, profile_sets = split_sets(set or [])
        layers: list[Layer] = [*profile_layers(self.profile_name),
                               (SOURCE, {k: v for k, v in fields.items() if k in ClusterProfile.model_fields})]
        if profile_sets:
            layers.append(("set", profile_sets))
        self.profile: ClusterProfile = validate_layers(ClusterProfile, layers)
        spec: JsonObject = {"resources": {k: v for k, v in fields.items() if k in RESOURCE_FIELDS}}
        spec.update({k: v for k, v in (("name", name), ("env", env), ("snapshot", snapshot), ("launcher", launcher))
                     if v is not None})
        self._spec_layers: list[Layer] = [(SOURCE, spec), *([("set", spec_sets)] if spec_sets else [])]
        self.resolve(lambda: None)  # every argument is checked now, not at the first submit
        self._checked_at: float | None = None

    if not TYPE_CHECKING:  # hidden from mypy, which would otherwise accept any attribute

        def __getattr__(self, name: str) -> Any:
            raise submitit_names.method_error("Executor", name, submitit_names.EXECUTOR_METHODS)

    def resolve(self, fn: Callable[..., Any]) -> Resolved:
        """The run spec a submit of fn gets: a `function` run named after fn unless name= was given."""
        return self._resolve({"name": _name_of(fn), "function": _qualified(fn)})

    def _resolve(self, base: JsonObject) -> Resolved:
        return resolve_layers([(SOURCE, base), *self._spec_layers], self.profile, self.profile_name)

    def update(self, **kw: Any) -> Executor:
        """A new executor with these arguments changed (the profile too, with profile=)."""
        merged = {"profile": self.profile_name, **self._kw, **kw}
        return Executor(**merged)

    def render(self, fn: Callable[..., Any]) -> str:
        """The sbatch script a submit of fn would send (a dry run: nothing is created)."""
        return jobs.dry_run(self.resolve(fn)).script

    def _remote(self, method: str, payload: Any, **params: Any) -> list[Any] | None:
        """Where the profile names a login host, the method runs there (slurmkit.remote.api)."""
        if self.profile.login is None:
            return None
        site = site_of(self.profile_name)
        assert site is not None
        return remote_api.submit(site, self.profile_name, self._kw, method, payload, params)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Job:
        """Run fn(*args, **kwargs) on every rank of one job; rank 0's return value is job.result()."""
        call = jobs.Call(fn, args, kwargs)
        check_call(call)
        if (remote := self._remote("submit", (fn, (args, kwargs)))) is not None:
            return remote[0]  # a RemoteJob: a Job's methods, answered there
        resolved = self.resolve(fn)
        # Every submit of an executor asks for the same resources: one pre-flight a minute serves them.
        fresh = self._checked_at is not None and time.monotonic() - self._checked_at < PREFLIGHT_TTL_S
        done = jobs.submit(resolved, call=call, preflighted=fresh)
        if not fresh:
            self._checked_at = time.monotonic()
        return Job(done.run_id, done.job_id or "", done.run_dir)

    def submit_command(self, command: str | list[str]) -> Job:
        """Run a shell command on every rank (a `command:` run): a list is quoted word by word. It gets
        MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, so a torchrun-style
        script runs as it is; job.result() is rank 0's {"returncode", "stdout"}."""
        text = command if isinstance(command, str) else shlex.join(command)
        if (remote := self._remote("submit_command", None, command=text)) is not None:
            return remote[0]
        words = shlex.split(text) if text.strip() else []
        name = _UNSAFE_NAME.sub("", Path(words[0]).name if words else "") or "command"
        done = jobs.submit(self._resolve({"name": name[:64], "command": text}))
        return Job(done.run_id, done.job_id or "", done.run_dir)

    def submit_components(self, parts: Mapping[str, Part | Callable[..., Any] | str], result: str | None = None,
                          name: str | None = None) -> Job:
        """A heterogeneous run (docs/heterogeneous.md): every part at once in one Slurm heterogeneous
        job, each a world of its own on its own resources (a slurmkit.Part, or a bare function or
        command on the executor's). The executor's resources (time, ...) and env apply to every part;
        job.result() is the `result` part's rank 0 return (the first part's by default)."""
        if self.profile.login is not None:
            raise ConfigError("submit_components does not run through a login host yet",
                              where=f"{self.profile_name}:login", valid="valid: `slurmkit submit SPEC -p PROFILE`")
        components: JsonObject = {}
        calls: dict[str, jobs.Call] = {}
        for part_name, given in parts.items():
            part = given if isinstance(given, Part) else Part(given)
            components[part_name], call = part.component()
            if call is not None:
                calls[part_name] = call
        named = next(iter(calls.values()), None)  # the run is named after its first function, if any
        base: JsonObject = {"name": name or (_name_of(named.fn) if named else "components"), "components": components,
                            **({"result": result} if result is not None else {})}
        done = jobs.submit(self._resolve(base), part_calls=calls)
        return Job(done.run_id, done.job_id or "", done.run_dir)

    def map_array(self, fn: Callable[..., Any], *iterables: Iterable[Any], max_parallel: int | None = None,
                  max_array_size: int | None = None) -> list[Job]:
        """fn(*items) for each tuple of items, as ONE Slurm job array (several only above MaxArraySize),
        throttled to max_parallel (else the executor's) running at once; one Job per item, in order."""
        items = [tuple(t) for t in zip(*iterables, strict=True)] if len(iterables) > 1 else [
            (x,) for x in (iterables[0] if iterables else [])]
        if not items:
            return []
        check_call(jobs.Call(fn, items[0]))
        throttle = self.max_parallel if max_parallel is None else max_parallel
        columns = list(zip(*items, strict=True))
        remote = self._remote("map_array", (fn, columns), max_parallel=throttle, max_array_size=max_array_size)
        if remote is not None:
            return remote
        return mapped.submit(self.resolve(fn), fn, items, throttle, max_array_size)


def sweep(spec: str | Path | JsonObject | Callable[..., Any], profile: str | None = None,
          grid: dict[str, list[Any]] | None = None, max_parallel: int | None = None, set: list[str] | None = None,
          search: JsonObject | None = None, prune: JsonObject | None = None,
          **fields: Any) -> SweepHandle:
    """Submit a sweep spec (a file, or a mapping with a `sweep:` section) as `slurmkit sweep` does.

    `search` (and `prune`) make it a search (docs/sweeps.md): the spec's own section, or given
    here. A function with search=: each trial calls fn(**params), a param without a section
    (`lr`) being its keyword, and returns its metric (a number, or a dict holding it); `fields`
    are Executor's (nodes, time, ...). The handle of a search is a SearchHandle (best(), trials())."""
    prof = load_profile(profile_name(profile))
    if prof.login is not None:
        raise ConfigError("slurmkit.sweep does not run through a login host yet",
                          where=f"{profile_name(profile)}:login",
                          valid="valid: `slurmkit sweep SPEC -p PROFILE` (the CLI's sweeps do), docs/remote.md")
    if callable(spec):
        if search is None:
            raise ConfigError("a function is swept by search=", where="slurmkit.sweep",
                              valid="valid: search={...}, or Executor.map_array for a list of arguments")
        ex = Executor(profile, max_parallel=max_parallel, set=set, **fields)
        check_call(jobs.Call(spec))  # it pickles, by value where the nodes cannot import its module
        return SearchHandle(mapped.search(ex.resolve(spec), spec, search, prune, max_parallel))
    if fields:
        raise ConfigError(f"unknown keyword argument {next(iter(fields))!r}", where="slurmkit.sweep",
                          valid="valid: a spec's resources are its own (resources:), or --set")
    plan = sweep_spec.load(spec if isinstance(spec, dict) else Path(spec), max_parallel=max_parallel,
                           grid_values=grid, max_tasks=prof.sweep_max_tasks,
                           sections={"search": search, "prune": prune})
    done = submit(plan, profile, set)
    paths = SweepPaths(Path(done.sweep_dir))
    return SearchHandle(paths) if plan.section.search is not None else SweepHandle(paths)
