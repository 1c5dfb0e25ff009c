"""Submitting a run: check the request, create its folder and record, hand the pickled call to
submitit (or render it only: a dry run)."""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmkit.build import SubmitRequest, build
from slurmkit.calls import Run
from slurmkit.common import perms
from slurmkit.common.layout import RunPaths, expand_root
from slurmkit.common.record import RunFile, RunRecord
from slurmkit.common.work import work_of
from slurmkit.config.resolved import Resolved, ResolvedPart
from slurmkit.errors import ConfigError, SlurmError, SlurmkitError, squash
from slurmkit.jsontypes import JsonObject
from slurmkit.runs import local_checks, procs, registry, snapshot
from slurmkit.slurm import preflight
from slurmkit.slurm.submitter import submitter


@dataclass(frozen=True)
class Submitted:
    run_id: str
    job_id: str | None
    run_dir: str
    script: str


def run_env(resolved: Resolved, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every rank gets on top of the batch script's: profile, then spec, then extra."""
    return {**resolved.profile.setup.env, **resolved.spec.env, **(extra or {})}


@dataclass(frozen=True)
class Call:
    """A Python function and its arguments, carried by value in the job's pickle (slurmkit.Executor)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Place:
    """Where a run is queued: its folder, its checkpoints' key under a checkpoint_root, its code
    snapshot, and what its ranks get on top of its spec's env. A run's own (Place.of); a sweep's
    heterogeneous task's inside its sweep (sweeps.hetjobs: the sweep's key, snapshot and seed)."""

    paths: RunPaths
    key: str
    code_dir: Path | None
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, resolved: Resolved, paths: RunPaths) -> Place:
        return cls(paths, paths.run_id, paths.code_dir if resolved.snapshot else None)


def entry(resolved: Resolved, place: Place, call: Call | None = None, part: ResolvedPart | None = None) -> Any:
    """The callable submitit pickles for this run (for `part`, that part's of a heterogeneous run:
    its own folder, checkpoints and work, `call` its function's; the run's one code snapshot)."""
    own = part.resolved if part else resolved
    work = work_of(own.spec, call.fn, call.args, call.kwargs) if call else work_of(own.spec)
    folder = place.paths.part(part.name, part.primary) if part else place.paths
    return Run(work, run_dir=str(folder.run_dir), env=run_env(own, place.env),
               checkpoint_uri=folder.checkpoint_uri(resolved.profile.checkpoint_root,
                                                    part.run_id(place.key) if part else place.key),
               code_dir=str(place.code_dir) if place.code_dir else None)


def check_function_kind(resolved: Resolved, call: Call | None, parts: Mapping[str, Call] | None = None) -> None:
    """A spec's `function` is a Python function's name; only a submit from Python carries the function
    (a heterogeneous run's: one per part of kind function, by name: Executor.submit_components)."""
    for part in resolved.parts:
        check_function_kind(part.resolved, (parts or {}).get(part.name))
    if resolved.spec.function is not None and call is None:
        raise ConfigError("function is set only by slurmkit.Executor.submit", where=f"{resolved.spec_source}:function",
                          valid="valid: callable: module:function in a spec file")
    if call is not None and resolved.spec.function is None:
        raise ConfigError("a Python function needs a spec of kind function", where=resolved.spec_source)


def take_snapshot(resolved: Resolved, run_dir: Path, call: Call | None) -> JsonObject | None:
    """The code snapshot (when the run asks for one) into the run folder; what run.json records."""
    if not resolved.snapshot:
        return None

    module = sys.modules.get(getattr(call.fn, "__module__", "") or "") if call else None
    return snapshot.into(run_dir, RunPaths(run_dir).code_dir, getattr(module, "__file__", None),
                         resolved.profile.snapshot_max_mb)


def dry_run(resolved: Resolved, dependency: str | None = None) -> SubmitRequest:
    """Build exactly what submit would send (build.build: the shape, the plan, the script), for a
    run id and folder to be, creating nothing and calling no Slurm daemon; `send` sends this very
    value (rendered for a local profile too, unused there)."""
    local_checks.warn_idle_gpus(resolved)
    return _request(resolved, dependency)


def _request(resolved: Resolved, dependency: str | None) -> SubmitRequest:
    paths = RunPaths(expand_root(resolved.profile.run_root) / registry.new_run_id(resolved.spec.name))
    return build(resolved, paths.job_folder, dependency=dependency)


def submit(resolved: Resolved, dependency: str | None = None, call: Call | None = None,
           preflighted: bool = False, part_calls: Mapping[str, Call] | None = None) -> Submitted:
    """Check the request (pre-flight included, unless `preflighted`: the caller has just checked
    this same request against the live cluster, an Executor submitting again), then send what a
    dry run returns. dependency is an sbatch --dependency value (dependency.after_dependency); call
    is the Python function a `function` spec runs (slurmkit.Executor.submit); part_calls, by part
    name, those of a heterogeneous run's parts of kind function (Executor.submit_components)."""
    _check_request(resolved, dependency, call, preflighted, part_calls)
    if resolved.profile.executor == "slurm":
        resolved = preflight.avoid_blamed(resolved)
    return send(_request(resolved, dependency), call, part_calls)


def send(request: SubmitRequest, call: Call | None = None, part_calls: Mapping[str, Call] | None = None) -> Submitted:
    """Create the run folder and record the request names, submit it through submitit (sbatch gets
    request.script, byte for byte), record the job id. Everything the submit creates gets the run's
    umask (perms); a submit that fails before anything is queued leaves nothing behind."""
    resolved = request.resolved
    run_mode = resolved.profile.run_mode
    with perms.umask(run_mode):
        paths = registry.create(resolved.profile.run_root, resolved.spec.name, run_mode,
                                resolved.profile.checkpoint_root, run_id=request.run_paths.run_id)
        record = RunFile(paths)
        # Nothing queued: no folder, no record that could claim a job.
        with registry.or_nothing(paths, resolved.profile.checkpoint_root):
            record.create(RunRecord(
                run_id=paths.run_id, name=resolved.spec.name, run_dir=str(paths.run_dir),
                created=dt.datetime.now().isoformat(timespec="seconds"), executor=resolved.profile.executor,
                profile_name=resolved.profile_name, spec_source=resolved.spec_source,
                spec=resolved.spec.model_dump(), profile=resolved.profile.model_dump(),
                resources=resolved.resources.model_dump(), num_tasks=request.shape.num_tasks,
                env=request.stage.record() if request.stage else None))
            if (snap := take_snapshot(resolved, paths.run_dir, call)) is not None:
                record.update(snapshot=snap)
            job_id, script = queue(request, Place.of(resolved, paths), call, part_calls)
        recorded(paths, resolved, job_id, script)
    return Submitted(run_id=paths.run_id, job_id=job_id, run_dir=str(paths.run_dir), script=script)


def queue(request: SubmitRequest, place: Place, call: Call | None = None,
          part_calls: Mapping[str, Call] | None = None,
          before_sbatch: Callable[[Path], None] | None = None) -> tuple[str, str]:
    """Send the request for a run whose folder and record exist at `place`: a heterogeneous run's
    other parts' folders and records made, the call (every part's) pickled under the job id. (The
    job id, the script sent.) `before_sbatch`: called with the script's path just before sbatch."""
    ex_mod = submitter()
    resolved = request.resolved
    parts = [p for p in resolved.parts if not p.primary]
    for part in parts:  # their folders and records; their calls go in once the job id is known
        _part_folder(resolved, place, part)
    try:
        if resolved.profile.executor == "slurm":
            executor: Any = ex_mod.RenderedSlurmExecutor(request)
            executor.before_sbatch = before_sbatch
        elif resolved.parts:
            executor = ex_mod.LocalPartsExecutor(request)
        else:
            executor = ex_mod.local_executor(place.paths.job_folder, resolved)
        primary = next((p for p in resolved.parts if p.primary), None)
        calls = part_calls or {}
        job = executor.submit(entry(resolved, place, calls.get(primary.name) if primary else call, primary))
        for part in parts:
            ex_mod.place_call(place.paths.part(part.name).job_folder, str(job.job_id),
                              entry(resolved, place, calls.get(part.name), part), executor)
    except Exception as exc:
        if isinstance(exc, (SlurmkitError, OSError)):
            raise
        raise SlurmError(f"submission failed: {squash(str(exc))}", where=resolved.profile_name) from exc
    return str(job.job_id), getattr(executor, "last_script", None) or ""


def recorded(paths: RunPaths, resolved: Resolved, job_id: str, script: str) -> None:
    """Queued: the job id is recorded first (with the script, in one write), so nothing later can lose it."""
    local = resolved.profile.executor != "slurm"
    RunFile(paths).add_job_id(job_id, pid_start=procs.start_time(int(job_id)) if local else None, script=script)
    if script:
        registry.write_script(paths, script)


def _part_folder(resolved: Resolved, place: Place, part: ResolvedPart) -> None:
    """A heterogeneous run's part's own run folder (parts/NAME) and record: its ranks' files go there.
    Kept where a sweep's task is submitted again (sweeps.hetjobs: `sweep resubmit --failed`)."""
    folder = place.paths.part(part.name).run_dir
    if RunPaths(folder).record.exists():
        return
    if not folder.parent.exists():
        perms.make_run_folder(folder.parent, resolved.profile.run_mode)
    perms.make_run_folder(folder, resolved.profile.run_mode)
    registry.claim_checkpoint_folder(resolved.profile.checkpoint_root, part.run_id(place.key),
                                     resolved.profile.run_mode)
    r = part.resolved
    RunFile(RunPaths(folder)).create(RunRecord(
        run_id=part.run_id(place.key), name=f"{resolved.spec.name}.{part.name}", run_dir=str(folder),
        created=dt.datetime.now().isoformat(timespec="seconds"), executor=r.profile.executor,
        profile_name=r.profile_name, spec_source=f"{resolved.spec_source}:components.{part.name}",
        spec=r.spec.model_dump(), profile=r.profile.model_dump(), resources=r.resources.model_dump(),
        num_tasks=r.shape.num_tasks))


def _check_request(resolved: Resolved, dependency: str | None, call: Call | None, preflighted: bool,
                   part_calls: Mapping[str, Call] | None) -> None:
    """What can be checked before anything is created."""
    check_function_kind(resolved, call, part_calls)
    container = resolved.profile.container
    check_secrets(resolved.spec.secret_env, resolved.spec_source,
                  {**resolved.profile.setup.env, **(container.env if container else {})})
    local_checks.warn_idle_gpus(resolved)
    if resolved.profile.executor == "slurm":
        if not preflighted:
            preflight.check(resolved)
        return
    if dependency:
        raise SlurmkitError("--after needs the slurm executor", where=resolved.profile_name,
                            valid="valid: a Slurm profile, e.g. -p devcluster")
    local_checks.check(resolved)


def check_secrets(names: list[str], source: str, written: dict[str, str]) -> None:
    """secret_env's variables are set here (the job takes them from this environment) and given no
    value that would be written down (the profile's setup.env or container.env)."""
    if missing := [n for n in names if n not in os.environ]:
        raise ConfigError(f"secret_env {', '.join(missing)} not set in this environment", where=f"{source}:secret_env",
                          valid="valid: export them before submitting (their values go only to the job)")
    if named := sorted(set(names) & set(written)):
        raise ConfigError(f"secret_env {', '.join(named)} has a value in the profile, which would be written down",
                          where=f"{source}:secret_env", valid="valid: leave it out of the profile's env")
