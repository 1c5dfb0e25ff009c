"""What one sweep task runs.

The batch shell of each array task first runs

    python -P -m slurmkit.worker.sweep_task --sweep-dir DIR --index N

which creates the task's run folder and run.json (once), records this job id there, links the
array's one pickle under this task's job id (--pickle), and prints shell assignments for the
batch shell to eval: the run folder and the task's own environment (every value shell-quoted).
Then every rank calls the pickled SweepTask (slurmkit.calls), whose Run `task_run` builds here
from the manifest, by its array index. Kept free of torch at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path

from slurmkit.common.layout import RunPaths
from slurmkit.common.slurm_env import slurm_job_id
from slurmkit.common.sweep_layout import Manifest, SweepPaths, load_call, materialize_task, task_entry
from slurmkit.common.work import work_of
from slurmkit.config.runspec import RunSpec
from slurmkit.jsontypes import JsonObject


def task_run(sweep_dir: str, base: int, index: int | None) -> JsonObject:
    """Array task base + SLURM_ARRAY_TASK_ID's (or `index`'s) run, as slurmkit.calls.Run's fields
    (that module calls this one): its own config, looked up in the manifest."""
    index = index if index is not None else base + int(os.environ["SLURM_ARRAY_TASK_ID"])
    paths = SweepPaths(Path(sweep_dir))
    entry = task_entry(paths, Manifest(paths).read(), index)
    fn, args = load_call(paths, index) if entry.spec.get("function") else (None, ())
    code = RunPaths(paths.sweep_dir).code_dir
    spec = RunSpec.model_validate(entry.spec)
    return {"work": work_of(spec, fn, args, spec.kwargs), "run_dir": entry.run_dir, "env": entry.env,
            "checkpoint_uri": entry.checkpoint_uri, "code_dir": str(code) if code.is_dir() else None}


def link_pickle(paths: SweepPaths, pickle: Path, job_id: str) -> None:
    """Give this task's submitit the array's pickle under the name it looks for (once: a requeued
    task finds it there)."""
    from submitit.core.utils import JobPaths

    target = JobPaths(paths.job_folder, job_id=job_id).submitted_pickle
    with contextlib.suppress(FileExistsError):
        os.link(pickle, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmkit.worker.sweep_task")
    parser.add_argument("--sweep-dir", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--pickle", help="The array's one pickle, linked under this task's job id.")
    args = parser.parse_args(argv)
    paths = SweepPaths(Path(args.sweep_dir))
    try:
        manifest = Manifest(paths).read()
        task = materialize_task(paths, args.index, slurm_job_id(), manifest)  # checks the index
        if args.pickle:
            link_pickle(paths, Path(args.pickle), slurm_job_id())
        env = task_entry(paths, manifest, args.index).env
    except (OSError, IndexError, ValueError, KeyError) as exc:
        print(f"slurmkit sweep task {args.index}: {exc}", file=sys.stderr)
        return 1
    lines = [f"SLURMKIT_RUN_DIR={shlex.quote(str(task.run_dir))}"]
    # Names were checked as shell identifiers when the spec was loaded (config.fields.EnvMap).
    lines += [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
