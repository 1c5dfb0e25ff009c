"""Executor.map_array: one Python function over many items, as a sweep of `function` tasks.

It is a sweep like any other (one manifest, one job array per MaxArraySize chunk, `slurmkit
sweep status/results/resubmit`, each task's own run folder), whose tasks differ only in their
arguments. The function and every task's arguments are one cloudpickle in the sweep folder
(SweepPaths.function_pickle), written privately before the first sbatch; each task reads its
own item by index (common.sweep_layout.load_call, from worker.sweep_task.SweepTask). Submitting
1,000 items pickles the function once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmkit.api.handles import Job
from slurmkit.common import perms
from slurmkit.common.atomic import atomic_write
from slurmkit.common.code_source import source_of
from slurmkit.common.sweep_layout import Manifest, SweepPaths, latest_job_ids
from slurmkit.config.resolved import Resolved
from slurmkit.jsontypes import JsonObject
from slurmkit.runs.jobs import Call
from slurmkit.sweeps.resolve import SweepTasks
from slurmkit.sweeps.spec import SweepPlan, SweepSection, check_keys, section_of
from slurmkit.sweeps.submit import launch

if TYPE_CHECKING:
    pass

SOURCE = "Executor.map_array"
SEARCH_SOURCE = "slurmkit.sweep"


def plan_for(resolved: Resolved, n: int, max_parallel: int | None) -> tuple[SweepPlan, SweepTasks]:
    """n tasks of the same spec: no overrides, task i seeded i, one resource group."""
    section = SweepSection.model_validate({"list": [{}] * n, "max_parallel": max_parallel})
    spec = resolved.spec.model_dump()
    plan = SweepPlan(SOURCE, resolved.spec.name, [(SOURCE, spec)], section, [{}] * n)
    return plan, SweepTasks([resolved], [0] * n, list(range(n)), [None] * n, spec, {})


def _launch(plan: SweepPlan, tasks: SweepTasks, resolved: Resolved, fn: Callable[..., Any],
            items: list[tuple[Any, ...]] | None, max_array_size: int | None) -> SweepPaths:
    """The sweep made with the function pickle written into it (items None: a search's, whose
    tasks take their params as keywords), then submitted."""
    import cloudpickle

    payload = cloudpickle.dumps((fn, items, source_of(fn)))

    def write_function(paths: SweepPaths) -> None:
        atomic_write(paths.function_pickle, payload, perms.file_mode(paths.sweep_dir))

    with perms.umask(resolved.profile.run_mode):
        done = launch(plan, tasks, max_array_size, prepare=write_function, call=Call(fn))
    return SweepPaths(Path(done.sweep_dir))


def submit(resolved: Resolved, fn: Callable[..., Any], items: list[tuple[Any, ...]], max_parallel: int | None,
           max_array_size: int | None) -> list[Job]:
    plan, tasks = plan_for(resolved, len(items), max_parallel)
    paths = _launch(plan, tasks, resolved, fn, items, max_array_size)
    latest = latest_job_ids(Manifest(paths).read())
    return [Job(f"{paths.sweep_id}/{i}", latest[i] or "", str(paths.task(i).run_dir)) for i in range(len(items))]


def search(resolved: Resolved, fn: Callable[..., Any], search: JsonObject, prune: JsonObject | None,
           max_parallel: int | None) -> SweepPaths:
    """slurmkit.sweep(fn, search=...): a search whose trials call fn(**params); a param key without
    a section (`lr`) is the function's keyword (`kwargs.lr`)."""
    params = {k if "." in k else f"kwargs.{k}": v for k, v in dict(search.get("params") or {}).items()}
    section = section_of({"search": {**search, "params": params}, "prune": prune, "max_parallel": max_parallel},
                         SEARCH_SOURCE)
    check_keys(section, SEARCH_SOURCE, None)
    spec = resolved.spec.model_dump()
    plan = SweepPlan(SEARCH_SOURCE, resolved.spec.name, [(SEARCH_SOURCE, spec)], section, [])
    return _launch(plan, SweepTasks([resolved], [], [], [], spec, {}), resolved, fn, None, None)
