"""Sweep folders and the manifest: SweepPaths is the only code that builds sweep paths; read by both sides (the
login node writes the manifest and array log, each array task's batch shell creates its task's run
folder, every rank reads its own task).

    <run_root>/<sweep_id>/sweep.json        the manifest, written once, before anything is submitted
    <run_root>/<sweep_id>/arrays.json       every job array submitted for it, updated under a lock
    <run_root>/<sweep_id>/submitit/         submitit's folder, shared by every array of the sweep
    <run_root>/<sweep_id>/tasks/<index>/    each task's own run folder (run.json, metrics, checkpoints)
    <run_root>/<sweep_id>/study.journal     a search's Optuna study (sweeps.study), its driver's
                         driver.json, driver.log  and the driver's record and output (sweeps.search)

The manifest maps every task index to its config (the validated base spec plus the task's
overrides, or the task's whole spec where it cannot be rebuilt so), seed and resource group. The
array log lists every job array submitted for the sweep (initial, split and resubmitted), so no
task is ever dropped silently: a task whose array failed to submit shows up as NOT_SUBMITTED. The
two are apart so that recording a job id rewrites a small file, not a 100,000-task manifest.
Both are typed records (SweepManifest, ArrayList) with one reader and one writer each (Manifest, ArrayLog).
The manifest is written once, before anything is submitted, except that a search's driver adds
each batch's trials to it (Manifest.add_tasks) before it submits their array: a task is in the
manifest before any job can run it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from slurmkit import trust
from slurmkit.common.code_source import with_source
from slurmkit.common.layout import RunPaths
from slurmkit.common.locked import LockedJson, Record
from slurmkit.common.record import RunFile, RunRecord, SweepRef
from slurmkit.config.runspec import RunSpec
from slurmkit.config.search import PruneSection, SearchSection
from slurmkit.jsontypes import JsonObject
from slurmkit.load.overrides import deep_merge, nested

MANIFEST = "sweep.json"
ARRAYS = "arrays.json"


@dataclass(frozen=True)
class SweepPaths:
    sweep_dir: Path

    @property
    def sweep_id(self) -> str:
        return self.sweep_dir.name

    @property
    def manifest(self) -> Path:
        return self.sweep_dir / MANIFEST

    @property
    def arrays(self) -> Path:
        return self.sweep_dir / ARRAYS

    @property
    def job_folder(self) -> Path:
        return self.sweep_dir / "submitit"

    @property
    def tasks_dir(self) -> Path:
        """Where task folders are made, each when its task first starts."""
        return self.sweep_dir / "tasks"

    def task(self, index: int) -> RunPaths:
        return RunPaths(self.tasks_dir / str(index))

    def script(self, array_number: int) -> Path:
        return self.sweep_dir / f"sbatch-{array_number}.sh"

    def array_pickle(self, array_number: int) -> Path:
        """The one pickle every task of that array runs (each task links it under its job id)."""
        return self.job_folder / f"array-{array_number}.pkl"

    @property
    def snapshot_record(self) -> Path:
        """The sweep's code snapshot (code/), as a plain run's run.json records it."""
        return self.sweep_dir / "snapshot.json"

    @property
    def function_pickle(self) -> Path:
        """A map_array's function and every task's arguments (slurmkit.api.mapped)."""
        return self.sweep_dir / "function.pkl"

    @property
    def study(self) -> Path:
        """A search's Optuna study: its journal file (sweeps.study)."""
        return self.sweep_dir / "study.journal"

    @property
    def driver(self) -> Path:
        """A search's driver: its pid, host and state (sweeps.search.DriverRecord)."""
        return self.sweep_dir / "driver.json"

    @property
    def driver_log(self) -> Path:
        """A search driver's output."""
        return self.sweep_dir / "driver.log"

    @property
    def driver_lock(self) -> Path:
        """Held by a search's driver for its life (one driver at a time)."""
        return self.sweep_dir / ".driver.lock"

    def runner_lock(self, array_number: int) -> Path:
        """Held by local array `array_number`'s starter, then its runner, while either lives."""
        return self.sweep_dir / f".runner-{array_number}.lock"

    @property
    def local_runner_log(self) -> Path:
        """Output of the local executor's runner (sweeps on the `local` profile)."""
        return self.sweep_dir / "local-runner.log"


class ManifestTask(Record):
    """One task of the manifest: what varies (its overrides, seed and resource group)."""

    index: int
    overrides: JsonObject = {}
    """Dotted keys → values, over the base spec."""
    seed: int
    group: int = 0
    """Index into the manifest's `groups`."""
    spec: JsonObject | None = None
    """The task's whole spec, where the base spec and overrides cannot rebuild it."""
    invalid: str | None = None
    """A search's trial whose params the spec refused when it was asked: why. It is never submitted,
    its state is FAILED, and the study is told so; the search goes on."""


class ResourceGroup(Record):
    """Resources shared by tasks: one sbatch script (and array) per group."""

    resources: JsonObject
    num_tasks: int


class ArrayEntry(Record):
    """One job array submitted for the sweep (or, on the local profile, one runner)."""

    kind: Literal["initial", "resubmit", "local"]
    indices: list[int]
    """The sweep's task indices it runs: task `i` is array index `i - base`."""
    base: int = 0
    array: str = ""
    """sbatch's --array value."""
    group: int = 0
    created: str = ""
    job_id: str | None = None
    """The array's job id, once sbatch answered."""
    error: str | None = None
    """Why sbatch refused it, or that it was never queued (its tasks show NOT_SUBMITTED)."""
    submission: str | None = None
    """The script's file name sbatch was given, written before sbatch ran: how `sweeps.arrays.recover`
    finds the job of a submitter killed before it wrote the job id."""
    sbatch_at: float | None = None
    """When that sbatch started (epoch seconds): past its timeout, an array not found was never queued."""
    jobs: dict[str, str] = {}
    """local: task index → its controller's pid."""
    job_starts: dict[str, int | None] = {}
    """local: task index → that pid's start time (runs.procs)."""
    runner_pid: int | None = None
    runner_start: int | None = None
    single: bool = False
    """One task's own job, not an array (a heterogeneous spec's task: sweeps.hetjobs): job_id is the task's."""


class ArrayList(Record):
    """arrays.json."""

    arrays: list[ArrayEntry] = []


class SweepManifest(Record):
    """sweep.json: every task's config, written once before anything is submitted."""

    sweep_id: str
    name: str
    source: str = ""
    created: str = ""
    executor: str = ""
    profile_name: str = ""
    profile: JsonObject = {}
    varying: list[str] = []
    """The keys that differ between tasks (the columns of `sweep status`)."""
    max_parallel: int | None = None
    base_spec: JsonObject | None = None
    """The spec every task's overrides apply to; None where each task holds its whole spec."""
    top: JsonObject = {}
    """--set values, applied over each task's overrides."""
    groups: list[ResourceGroup] = []
    checkpoint_base: str | None = None
    search: SearchSection | None = None
    """A search sweep's section: its tasks are its trials, added batch by batch (task i is trial i)."""
    prune: PruneSection | None = None
    seed: int = 0
    """Base of the per-task seed for tasks without config.seed (the sweep section's seed)."""
    tasks: list[ManifestTask] = []
    arrays: list[ArrayEntry] = []
    """Filled on read from arrays.json (ArrayLog); written empty."""


class Manifest(LockedJson[SweepManifest]):
    """sweep.json, with the array log folded in as its `arrays` on read. Written once (`create`),
    but for a search's trials, added batch by batch (`add_tasks`)."""

    model = SweepManifest
    missing_error = "sweep has no sweep.json"
    indent = None  # 100,000 tasks: keep it one line, unsorted, quick to write and read
    sort_keys = False

    def __init__(self, paths: SweepPaths) -> None:
        super().__init__(paths.manifest)
        self.paths = paths

    def editing(self) -> Any:
        raise TypeError("sweep.json is written once; job arrays are recorded through ArrayLog")

    def update(self, **changes: object) -> SweepManifest:
        raise TypeError("sweep.json is written once; job arrays are recorded through ArrayLog")

    def read(self) -> SweepManifest:
        manifest = super().read()
        manifest.arrays = ArrayLog(self.paths).read().arrays
        return manifest

    def add_tasks(self, tasks: list[ManifestTask]) -> SweepManifest:
        """A search's next trials, appended under the lock (each must be the next index); the
        manifest as `read` gives it."""
        with self._locked():
            manifest = super().read()
            if manifest.search is None:
                raise TypeError("only a search sweep adds tasks after it is created")
            for task in tasks:
                if task.index != len(manifest.tasks):
                    raise ValueError(f"task {task.index} added as task {len(manifest.tasks)}")
                manifest.tasks.append(task)
            self._save(manifest)
        manifest.arrays = ArrayLog(self.paths).read().arrays  # as read() gives it: the arrays folded in
        return manifest


class ArrayLog(LockedJson[ArrayList]):
    """arrays.json: what was submitted for the sweep; `editing()` is the only way to change it."""

    model = ArrayList
    missing_error = "sweep has no arrays.json"
    indent = None  # json's C encoder: an array's 10,000 indices are rewritten at each job id recorded

    def __init__(self, paths: SweepPaths) -> None:
        super().__init__(paths.arrays)
        self.paths = paths


class DriverRecord(Record):
    """driver.json: who drives the search now, and the pruner's verdicts (one writer: the driver)."""

    pid: int | None = None
    start: int | None = None
    """The pid's start time (runs.procs): a pid reused by another process is never taken for it."""
    host: str = ""
    state: Literal["running", "done", "stopped", "failed"] = "running"
    detail: str = ""
    """Why it failed or stopped, in one line."""
    pruned: dict[str, int] = {}
    """Task index -> the step at which the pruner stopped it."""


class DriverFile(LockedJson[DriverRecord]):
    """driver.json: written by the search's driver (sweeps.search), read by `sweep status`."""

    model = DriverRecord
    missing_error = "the search has no driver record"

    def __init__(self, paths: SweepPaths) -> None:
        super().__init__(paths.driver)


@dataclass(frozen=True)
class TaskEntry:
    """What one task runs and where."""

    spec: JsonObject
    resources: JsonObject
    num_tasks: int
    env: dict[str, str]
    run_dir: str
    checkpoint_uri: str


def task_spec(manifest: SweepManifest, index: int) -> JsonObject:
    """The task's validated run spec: base spec < its sweep overrides < --set."""
    task = manifest.tasks[index]
    if task.spec is not None:
        return dict(task.spec)

    merged = deep_merge(deep_merge(manifest.base_spec or {}, nested(task.overrides)), manifest.top)
    return RunSpec.model_validate(merged).model_dump()


def task_entry(paths: SweepPaths, manifest: SweepManifest, index: int) -> TaskEntry:
    task = manifest.tasks[index]
    spec = task_spec(manifest, index)
    group = manifest.groups[task.group]
    env = {**manifest.profile["setup"]["env"], **spec["env"], "SLURMKIT_SEED": str(task.seed)}
    run = paths.task(index)
    base = manifest.checkpoint_base
    uri = f"{base}/{manifest.sweep_id}/{index}" if base else str(run.checkpoints)
    return TaskEntry(spec, group.resources, group.num_tasks, env, str(run.run_dir), uri)


def task_record(paths: SweepPaths, manifest: SweepManifest, index: int) -> RunRecord:
    """A task's run.json, as `slurmkit status/logs/result` and the requeue policy expect it."""
    task = manifest.tasks[index]
    entry = task_entry(paths, manifest, index)
    snapshot = json.loads(paths.snapshot_record.read_text()) if paths.snapshot_record.exists() else None
    return RunRecord(
        run_id=f"{manifest.sweep_id}/{index}", name=manifest.name, run_dir=entry.run_dir, created=manifest.created,
        executor=manifest.executor, profile_name=manifest.profile_name, spec_source=manifest.source,
        spec=entry.spec, profile=manifest.profile, resources=entry.resources, num_tasks=entry.num_tasks,
        sweep=SweepRef(sweep_id=manifest.sweep_id, index=index, overrides=task.overrides, seed=task.seed),
        snapshot=snapshot)


def materialize_task(paths: SweepPaths, index: int, job_id: str, manifest: SweepManifest | None = None) -> RunPaths:
    """Create the task's run folder and run.json on first start, and record this job id.

    Done by the batch shell of each array task rather than at submission: 1,000 fsynced records
    would cost about a second on the login node, the manifest alone is one write. `manifest`:
    the manifest when the caller has already read it.
    """
    task = paths.task(index)
    record = RunFile(task)
    if not task.record.exists():
        manifest = manifest or Manifest(paths).read()
        if not 0 <= index < len(manifest.tasks):
            raise IndexError(f"sweep {paths.sweep_id} has no task {index}")
        record.create(task_record(paths, manifest, index))
        if not task.job_folder.is_symlink():
            paths.job_folder.mkdir(parents=True, exist_ok=True)
            # The task's submitit files live in the sweep's shared folder; the link keeps
            # RunPaths' names (results, rank logs) valid from the task's own folder.
            os.symlink(os.path.relpath(paths.job_folder, task.run_dir), task.job_folder)
    with record.editing() as data:
        if job_id and data.add_job_id(job_id):
            # A new job id is a fresh submission (a resubmit): earlier verdicts no longer apply.
            data.final = None
            data.failures = []
    return task


def load_call(paths: SweepPaths, index: int) -> tuple[Any, tuple[Any, ...]]:
    """On the node: a map_array's function and task `index`'s arguments (slurmkit.api.mapped),
    from the user's own private sweep folder, checked on the open file as submitit's own pickles are."""
    fn, items, *source = trust.load_pickle(paths.function_pickle, "the sweep's function")  # older: no source
    # A search's function (items None) takes its trial's params as keywords, from the task's spec.
    return with_source(fn, source[0] if source else None), tuple(items[index]) if items is not None else ()


def newest_arrays(manifest: SweepManifest) -> dict[int, ArrayEntry | None]:
    """Each task's newest array entry (None if none holds it yet)."""
    newest: dict[int, ArrayEntry | None] = {t.index: None for t in manifest.tasks}
    for arr in manifest.arrays:
        if arr.job_id or arr.kind == "local":
            for index in arr.indices:
                newest[index] = arr
    return newest


def latest_job_ids(manifest: SweepManifest) -> dict[int, str | None]:
    """Each task's newest job id: ARRAY_TASK on Slurm (a heterogeneous task's own job id), the
    controller pid on local; None before it exists."""
    latest: dict[int, str | None] = {}
    for index, arr in newest_arrays(manifest).items():
        if arr is None:
            latest[index] = None
        elif arr.kind == "local":
            latest[index] = arr.jobs.get(str(index))
        elif arr.single:
            latest[index] = arr.job_id
        else:
            latest[index] = f"{arr.job_id}_{index - arr.base}"
    return latest
