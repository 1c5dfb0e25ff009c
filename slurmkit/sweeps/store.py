"""Sweep folders and the manifest: SweepPaths is the only code that builds sweep paths.

    <run_root>/<sweep_id>/sweep.json        the manifest, written before anything is submitted
    <run_root>/<sweep_id>/submitit/         submitit's folder, shared by every array of the sweep
    <run_root>/<sweep_id>/tasks/<index>/    each task's own run folder (run.json, metrics, checkpoints)

The manifest maps every task index to its resolved config, run folder and seed, and lists every
job array submitted for the sweep (initial, split and resubmitted), so no task is ever dropped
silently: a task whose array failed to submit shows up as NOT_SUBMITTED.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmkit.config.loader import Resolved
from slurmkit.runs import LockedJson, RunPaths, RunRecord, find_folder, owned_folders

MANIFEST = "sweep.json"


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
    def job_folder(self) -> Path:
        return self.sweep_dir / "submitit"

    def task(self, index: int) -> RunPaths:
        return RunPaths(self.sweep_dir / "tasks" / str(index))

    def script(self, array_number: int) -> Path:
        return self.sweep_dir / f"sbatch-{array_number}.sh"

    @property
    def local_runner_log(self) -> Path:
        """Output of the local executor's runner (sweeps on the `local` profile)."""
        return self.sweep_dir / "local-runner.log"


class Manifest(LockedJson):
    missing_error = "sweep has no sweep.json"
    indent = None  # about 1 KB per task: keep a 1,000-task manifest quick to write and read

    def __init__(self, paths: SweepPaths) -> None:
        super().__init__(paths.manifest)
        self.paths = paths


def newest_arrays(manifest: dict[str, Any]) -> dict[int, dict[str, Any] | None]:
    """Each task's newest array entry (None if none holds it yet)."""
    newest: dict[int, dict[str, Any] | None] = {t["index"]: None for t in manifest["tasks"]}
    for arr in manifest.get("arrays", []):
        if arr.get("job_id") or arr.get("kind") == "local":
            for index in arr["indices"]:
                newest[index] = arr
    return newest


def latest_job_ids(manifest: dict[str, Any]) -> dict[int, str | None]:
    """Each task's newest job id: ARRAY_TASK on Slurm, the controller pid on local; None before it exists."""
    latest: dict[int, str | None] = {}
    for index, arr in newest_arrays(manifest).items():
        if arr is None:
            latest[index] = None
        elif arr.get("kind") == "local":
            latest[index] = arr["jobs"].get(str(index))
        else:
            latest[index] = f"{arr['job_id']}_{index - arr['base']}"
    return latest


def list_sweeps(run_root: str) -> list[SweepPaths]:
    return [SweepPaths(d) for d in owned_folders(run_root, MANIFEST, "sweep")]


def find_sweep(run_root: str, sweep: str) -> SweepPaths:
    return SweepPaths(find_folder(run_root, sweep, MANIFEST, "sweep"))


def task_record(manifest: dict[str, Any], index: int) -> dict[str, Any]:
    """A task's run.json, as `slurmkit status/logs/result` and the requeue policy expect it."""
    task = manifest["tasks"][index]
    return {
        "run_id": f"{manifest['sweep_id']}/{index}", "name": manifest["name"], "run_dir": task["run_dir"],
        "created": manifest["created"], "executor": manifest["executor"], "profile_name": manifest["profile_name"],
        "spec_source": manifest["source"], "spec": task["spec"], "profile": manifest["profile"],
        "resources": task["resources"], "num_tasks": task["num_tasks"], "job_ids": [],
        "sweep": {"sweep_id": manifest["sweep_id"], "index": index, "overrides": task["overrides"],
                  "seed": task["seed"]},
    }


def materialize_task(paths: SweepPaths, index: int, job_id: str, manifest: dict[str, Any] | None = None) -> RunPaths:
    """Create the task's run folder and run.json on first start, and record this job id.

    Done by the batch shell of each array task rather than at submission: 1,000 fsynced records
    would cost about a second on the login node, the manifest alone is one write. `manifest`:
    the manifest when the caller has already read it.
    """
    task = paths.task(index)
    record = RunRecord(task)
    if not task.record.exists():
        manifest = manifest or Manifest(paths).read()
        if not 0 <= index < len(manifest["tasks"]):
            raise IndexError(f"sweep {paths.sweep_id} has no task {index}")
        record.create(task_record(manifest, index))
        if not task.job_folder.is_symlink():
            paths.job_folder.mkdir(parents=True, exist_ok=True)
            # The task's submitit files live in the sweep's shared folder; the link keeps
            # RunPaths' names (results, rank logs) valid from the task's own folder.
            os.symlink(os.path.relpath(paths.job_folder, task.run_dir), task.job_folder)
    with record.editing() as data:
        if job_id and job_id not in data["job_ids"]:
            # A new job id is a fresh submission (a resubmit): earlier verdicts no longer apply.
            data["job_ids"].append(job_id)
            data.pop("final", None)
            data.pop("failures", None)
    return task


def manifest_resolved(manifest: dict[str, Any]) -> list[Resolved]:
    """Every task's Resolved, rebuilt from the manifest (what was submitted, not today's files)."""
    from slurmkit.config.profile import ClusterProfile, Resources
    from slurmkit.config.runspec import RunSpec

    prof = ClusterProfile.model_validate(manifest["profile"])
    return [Resolved(RunSpec.model_validate(t["spec"]), prof, manifest["profile_name"],
                     Resources.model_validate(t["resources"]), manifest["source"]) for t in manifest["tasks"]]
