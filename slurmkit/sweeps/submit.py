"""Submitting a sweep: resolve every task, write the manifest, then one job array per chunk.

A chunk holds at most MaxArraySize tasks (read from the live cluster), and task ids inside an
array stay below MaxArraySize, as Slurm requires. Tasks whose resources differ cannot share an
array, so they are grouped first. `%N` throttles each array; when a sweep is split, each chunk
waits for the previous one (afterany) so that N also holds across the whole sweep.
"""

from __future__ import annotations

import datetime as dt
import shutil
from dataclasses import dataclass
from typing import Any

from slurmkit import perms
from slurmkit.common.atomic import atomic_write_text
from slurmkit.config.loader import Resolved, load_profile, profile_name, resolve_layers
from slurmkit.config.overrides import split_sets
from slurmkit.errors import PreflightError, SlurmError, SlurmkitError, squash
from slurmkit.runs import RunPaths
from slurmkit.sweeps.spec import SweepPlan, nested
from slurmkit.sweeps.store import Manifest, SweepPaths, latest_job_ids
from slurmkit.sweeps.task import SweepTask

# Final states after which `resubmit --failed` runs a task again.
RETRY_STATES = frozenset({"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                          "PREEMPTED", "NOT_SUBMITTED"})


@dataclass(frozen=True)
class SweepSubmitted:
    sweep_id: str
    sweep_dir: str
    tasks: int
    array_job_ids: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"sweep_id": self.sweep_id, "tasks": self.tasks, "array_job_ids": self.array_job_ids,
                "sweep_dir": self.sweep_dir}


def resolve_tasks(plan: SweepPlan, profile: str | None = None, sets: list[str] | None = None) -> list[Resolved]:
    """Every task's run spec against the profile: base spec < sweep overrides < --set."""
    spec_sets, profile_sets = split_sets(sets or [])
    name = profile_name(profile)
    prof = load_profile(name, profile_sets)
    top = [("--set", spec_sets)] if spec_sets else []
    return [resolve_layers([*plan.base_layers, (f"{plan.source}:sweep", nested(o)), *top], prof, name)
            for o in plan.overrides]


def task_seed(resolved: Resolved, base_seed: int, index: int) -> int:
    if resolved.spec.task == "train":
        from slurmkit.config.train import TrainConfig

        return int(resolved.spec.config.get("seed", TrainConfig.model_fields["seed"].default))
    return base_seed + index


def compress(ids: list[int]) -> str:
    """[0,1,2,5,7,8] -> '0-2,5,7-8'."""
    parts: list[str] = []
    start = prev = ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def chunks(indices: list[int], max_array_size: int) -> list[tuple[int, list[int]]]:
    """Split sorted indices into (base, indices), base a multiple of max_array_size.

    Array task ids (index - base) then stay below MaxArraySize, and in a sweep that fits in one
    array they equal the sweep index, so `squeue` shows 123_7 for task 7 (resubmits too).
    """
    out: list[tuple[int, list[int]]] = []
    for i in indices:
        base = i - i % max_array_size
        if not out or out[-1][0] != base:
            out.append((base, []))
        out[-1][1].append(i)
    return out


def plan_arrays(resolved: list[Resolved], indices: list[int], max_array_size: int,
                max_parallel: int | None) -> list[dict[str, Any]]:
    """The arrays that run `indices`: grouped by resources, then chunked."""
    groups: dict[str, list[int]] = {}
    for i in indices:
        groups.setdefault(resolved[i].resources.model_dump_json(), []).append(i)
    arrays: list[dict[str, Any]] = []
    for group in groups.values():
        for base, members in chunks(sorted(group), max_array_size):
            spec = compress([i - base for i in members]) + (f"%{max_parallel}" if max_parallel else "")
            arrays.append({"indices": members, "base": base, "array": spec, "job_id": None})
    return arrays


DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default; used only by --dry-run, which asks no daemon


def preview(plan: SweepPlan, resolved: list[Resolved], max_array_size: int | None = None) -> dict[str, Any]:
    """What submit would create: every task's varying values and seed, and the arrays."""
    limit = max_array_size or DEFAULT_MAX_ARRAY_SIZE
    arrays = plan_arrays(resolved, list(range(len(resolved))), limit, plan.section.max_parallel)
    tasks = [{"index": i, **{k: o.get(k) for k in plan.varying}, "seed": task_seed(r, plan.section.seed, i)}
             for i, (r, o) in enumerate(zip(resolved, plan.overrides, strict=True))]
    return {"sweep_id": None, "tasks": len(resolved), "varying": plan.varying, "configs": tasks,
            "arrays": [{"tasks": compress(a["indices"]), "array": a["array"]} for a in arrays],
            "max_array_size": limit}


def cluster_limits() -> tuple[int, int]:
    """(MaxArraySize, MaxJobCount) of the live cluster."""
    from slurmkit.slurm import commands

    conf = commands.show_config()
    return int(conf.get("MaxArraySize", "1001")), int(conf.get("MaxJobCount", "10000"))


def _submit_arrays(paths: SweepPaths, resolved: list[Resolved], arrays: list[dict[str, Any]], kind: str,
                   dependency: str | None) -> list[str]:
    """sbatch each planned array, recording each job id in the manifest as soon as it exists."""
    from slurmkit.slurm import commands
    from slurmkit.slurm.executor import ArraySpec, RenderedSlurmExecutor

    with Manifest(paths).editing() as manifest:
        first_number = len(manifest.setdefault("arrays", []))
        chain = manifest.get("max_parallel") and len(arrays) > 1
        for arr in arrays:
            arr.update(kind=kind, created=dt.datetime.now().isoformat(timespec="seconds"))
        manifest["arrays"].extend(arrays)
    ids: list[str] = []
    for k, arr in enumerate(arrays):
        deps = [d for d in (dependency, f"afterany:{ids[-1]}" if chain and ids else None) if d]
        executor = RenderedSlurmExecutor(paths.job_folder, resolved[arr["indices"][0]], ",".join(deps) or None)
        spec = ArraySpec(arr["array"], [i - arr["base"] for i in arr["indices"]], arr["base"], str(paths.sweep_dir))
        try:
            jobs = executor.submit_sweep_array(SweepTask(str(paths.sweep_dir), arr["base"]), spec)
        except Exception as exc:
            detail = squash(str(exc))
            with Manifest(paths).editing() as manifest:
                manifest["arrays"][first_number + k]["error"] = detail
            if isinstance(exc, SlurmkitError):
                raise
            queued = first_number + k > 0  # else submit() removes the sweep: nothing to resubmit
            raise SlurmError(f"array {first_number + k} (tasks {compress(arr['indices'])}) failed to submit: {detail}",
                             where=paths.sweep_id, valid="its tasks show NOT_SUBMITTED; `slurmkit sweep resubmit "
                             "SWEEP --failed` retries them" if queued else None) from exc
        job_id = commands.base_id(jobs[0].job_id)
        ids.append(job_id)
        atomic_write_text(paths.script(first_number + k), executor.last_script or "",
                          perms.FILE_MODE[perms.folder_kind(paths.sweep_dir)])
        with Manifest(paths).editing() as manifest:
            manifest["arrays"][first_number + k]["job_id"] = job_id
    return ids


def create(plan: SweepPlan, resolved: list[Resolved]) -> SweepPaths:
    """Write the manifest atomically; nothing is submitted yet."""
    prof = resolved[0].profile
    created = RunPaths.create(prof.run_root, f"{plan.name}-sweep", prof.run_mode)
    paths = SweepPaths(created.run_dir)
    with created.or_nothing():
        _write_manifest(paths, plan, resolved)
    return paths


def _write_manifest(paths: SweepPaths, plan: SweepPlan, resolved: list[Resolved]) -> None:
    from slurmkit.jobs import run_env

    prof = resolved[0].profile
    tasks = []
    for i, (res, overrides) in enumerate(zip(resolved, plan.overrides, strict=True)):
        seed = task_seed(res, plan.section.seed, i)
        task = paths.task(i)
        tasks.append({"index": i, "overrides": overrides, "seed": seed, "run_dir": str(task.run_dir),
                      "spec": res.spec.model_dump(), "resources": res.resources.model_dump(),
                      "num_tasks": res.num_tasks, "env": run_env(res, {"SLURMKIT_SEED": str(seed)}),
                      "checkpoint_uri": task.checkpoint_uri(prof.checkpoint_root, f"{paths.sweep_id}/{i}")})
    Manifest(paths).create({
        "sweep_id": paths.sweep_id, "name": plan.name, "source": plan.source,
        "created": dt.datetime.now().isoformat(timespec="seconds"), "executor": prof.executor,
        "profile_name": resolved[0].profile_name, "profile": prof.model_dump(), "varying": plan.varying,
        "max_parallel": plan.section.max_parallel, "tasks": tasks, "arrays": [],
    })


def submit(plan: SweepPlan, profile: str | None = None, sets: list[str] | None = None,
           max_array_size: int | None = None, after: str | None = None) -> SweepSubmitted:
    """Pre-flight, write the manifest, submit. max_array_size lowers the live MaxArraySize.

    Everything created, here and by the jobs, gets the profile's run_mode umask (perms).
    """
    prof = load_profile(profile_name(profile), split_sets(sets or [])[1])
    with perms.umask(prof.run_mode):
        return _submit(plan, profile, sets, max_array_size, after, prof.executor)


def _submit(plan: SweepPlan, profile: str | None, sets: list[str] | None, max_array_size: int | None,
            after: str | None, executor: str) -> SweepSubmitted:
    n = len(plan.overrides)
    if executor == "slurm":
        live_array, max_jobs = cluster_limits()
        if n > max_jobs:  # before resolving: a runaway spec is refused at once
            raise PreflightError(f"sweep of {n} tasks exceeds the cluster's MaxJobCount={max_jobs}",
                                 where=f"{plan.source}:sweep", valid=f"valid: at most {max_jobs} tasks")
    resolved = resolve_tasks(plan, profile, sets)
    if executor == "local":
        from slurmkit.sweeps import local

        paths = create(plan, resolved)
        local.start(paths, list(range(n)))
        return SweepSubmitted(paths.sweep_id, str(paths.sweep_dir), n, [])
    from slurmkit.slurm import preflight

    for res in {r.resources.model_dump_json(): r for r in resolved}.values():
        preflight.check(res)
    paths = create(plan, resolved)
    limit = min(max_array_size or live_array, live_array)
    arrays = plan_arrays(resolved, list(range(n)), limit, plan.section.max_parallel)
    try:
        ids = _submit_arrays(paths, resolved, arrays, "initial", after)
    except SlurmkitError:
        if not any(a.get("job_id") for a in Manifest(paths).read()["arrays"]):
            shutil.rmtree(paths.sweep_dir, ignore_errors=True)  # nothing queued: leave no sweep behind
        raise
    return SweepSubmitted(paths.sweep_id, str(paths.sweep_dir), n, ids)


def manifest_resolved(manifest: dict[str, Any]) -> list[Resolved]:
    """Every task's Resolved, rebuilt from the manifest (what was submitted, not today's files)."""
    from slurmkit.config.profile import ClusterProfile, Resources
    from slurmkit.config.runspec import RunSpec

    prof = ClusterProfile.model_validate(manifest["profile"])
    return [Resolved(RunSpec.model_validate(t["spec"]), prof, manifest["profile_name"],
                     Resources.model_validate(t["resources"]), manifest["source"]) for t in manifest["tasks"]]


def resubmit_failed(paths: SweepPaths, states: dict[int, str], max_array_size: int | None = None) -> list[int]:
    """One new array (per chunk) holding only the tasks that ended failed, cancelled or timed out."""
    with perms.umask(perms.folder_kind(paths.sweep_dir)):
        return _resubmit(paths, states, max_array_size)


def _resubmit(paths: SweepPaths, states: dict[int, str], max_array_size: int | None) -> list[int]:
    manifest = Manifest(paths).read()
    indices = sorted(i for i, st in states.items() if st in RETRY_STATES)
    if not indices:
        return []
    if manifest["executor"] == "local":
        from slurmkit.sweeps import local

        local.start(paths, indices)
        return indices
    resolved = manifest_resolved(manifest)
    live_array, _ = cluster_limits()
    arrays = plan_arrays(resolved, indices, max_array_size or live_array, manifest.get("max_parallel"))
    _submit_arrays(paths, resolved, arrays, "resubmit", None)
    return indices


def cancel(paths: SweepPaths) -> list[str]:
    """scancel every array of the sweep (local: stop the runner and every task's controller)."""
    from slurmkit.procs import signal_process

    manifest = Manifest(paths).read()
    if manifest["executor"] == "local":
        # Each pid with its recorded start time: a pid reused by another process is never signalled.
        procs = [(a.get("runner_pid"), a.get("runner_start")) for a in manifest["arrays"]]
        procs += [(jid, a.get("job_starts", {}).get(str(i))) for a in manifest["arrays"] if a.get("kind") == "local"
                  for i, jid in a.get("jobs", {}).items()]
        return [str(pid) for pid, start in procs if signal_process(pid, start)]
    from slurmkit.slurm import commands

    ids = [a["job_id"] for a in manifest["arrays"] if a.get("job_id")]
    if ids:
        commands.scancel(ids)
    return ids


def after_dependency(run_root: str, ident: str) -> str:
    """`afterok` on a sweep's arrays or a run's newest job, for --after RUN_OR_SWEEP."""
    from slurmkit.errors import RunNotFoundError
    from slurmkit.runs import RunRecord, find_run
    from slurmkit.slurm import commands
    from slurmkit.sweeps.store import find_sweep

    try:
        manifest = Manifest(find_sweep(run_root, ident)).read()
        executor = manifest["executor"]
        ids = [j for j in latest_job_ids(manifest).values() if j]
        # After a resubmit the first array holds failures forever; then depend on each task's newest job.
        if not any(a.get("kind") == "resubmit" for a in manifest["arrays"]):
            ids = list(dict.fromkeys(commands.base_id(j) for j in ids))
    except RunNotFoundError:
        try:
            record = RunRecord(find_run(run_root, ident)).read()
        except RunNotFoundError:
            raise RunNotFoundError(f"--after: no run or sweep '{ident}'", where=run_root,
                                   valid="valid: a run id (`slurmkit list`) or a sweep id (`slurmkit sweep list`)"
                                   ) from None
        executor, ids = record.get("executor"), list(record.get("job_ids") or [])[-1:]
    if executor == "local":
        raise PreflightError("--after needs a Slurm run or sweep; a local one has no job id Slurm knows", where=ident)
    if not ids:
        raise PreflightError(f"--after {ident}: it has no submitted job", where=ident)
    return "afterok:" + ":".join(ids)
