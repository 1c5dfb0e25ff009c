"""Planning a sweep: the job arrays that will run its tasks (sweeps.resolve validates them).

A chunk holds at most MaxArraySize tasks (read from the live cluster), and task ids inside an
array stay below MaxArraySize, as Slurm requires. Tasks whose resources differ cannot share an
array, so they are grouped first. `%N` throttles each array; when a sweep is split, each chunk
waits for the previous one (afterany) so that N also holds across the whole sweep.
"""

from __future__ import annotations

from slurmkit.jsontypes import JsonObject
from slurmkit.sweeps.resolve import SweepTasks
from slurmkit.sweeps.spec import SweepPlan


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


def plan_arrays(group_of: list[int], indices: list[int], max_array_size: int,
                max_parallel: int | None) -> list[JsonObject]:
    """The arrays that run `indices`: grouped by resource group (group_of[index]), then chunked."""
    groups: dict[int, list[int]] = {}
    for i in indices:
        groups.setdefault(group_of[i], []).append(i)
    arrays: list[JsonObject] = []
    for group, members_of_group in groups.items():
        for base, members in chunks(sorted(members_of_group), max_array_size):
            spec = compress([i - base for i in members]) + (f"%{max_parallel}" if max_parallel else "")
            arrays.append({"indices": members, "base": base, "array": spec, "job_id": None, "group": group})
    return arrays


DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default; used only by --dry-run, which asks no daemon


def preview(plan: SweepPlan, tasks: SweepTasks, max_array_size: int | None = None) -> JsonObject:
    """What submit would create: every task's varying values and seed, and the arrays."""
    limit = max_array_size or DEFAULT_MAX_ARRAY_SIZE
    arrays = plan_arrays(tasks.group_of, list(range(len(tasks))), limit, plan.section.max_parallel)
    configs = [{"index": i, **{k: o.get(k) for k in plan.varying}, "seed": seed}
               for i, (seed, o) in enumerate(zip(tasks.seeds, plan.overrides, strict=True))]
    return {"sweep_id": None, "tasks": len(tasks), "varying": plan.varying, "configs": configs,
            "arrays": [{"tasks": compress(a["indices"]), "array": a["array"]} for a in arrays],
            "max_array_size": limit}
