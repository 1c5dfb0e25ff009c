"""Planning a sweep: every task resolved, its seed, and the job arrays that will run it.

A chunk holds at most MaxArraySize tasks (read from the live cluster), and task ids inside an
array stay below MaxArraySize, as Slurm requires. Tasks whose resources differ cannot share an
array, so they are grouped first. `%N` throttles each array; when a sweep is split, each chunk
waits for the previous one (afterany) so that N also holds across the whole sweep.
"""

from __future__ import annotations

from typing import Any

from slurmkit.config.loader import Resolved, load_profile, profile_name, resolve_layers
from slurmkit.config.overrides import split_sets
from slurmkit.sweeps.spec import SweepPlan, nested


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
