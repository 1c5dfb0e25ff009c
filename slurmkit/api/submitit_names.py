"""submitit's names and slurmkit's for each, so that a submitit habit gets a pointer, not a bare
AttributeError or a list of every valid name (docs/from-submitit.md has the whole table)."""

from __future__ import annotations

EXECUTOR_KEYWORDS = {
    "folder": "run_root (a profile field: where run folders go; each run gets its own)",
    "timeout_min": "time (minutes, or HH:MM:SS)",
    "mem_gb": 'mem (Slurm\'s form, e.g. mem="16G")',
    "slurm_mem": 'mem (e.g. mem="16G")',
    "slurm_time": "time",
    "slurm_array_parallelism": "max_parallel (Executor(max_parallel=N), or map_array(fn, items, max_parallel=N))",
    "slurm_additional_parameters": 'sbatch_args (the same mapping, e.g. sbatch_args={"mail_type": "END"})',
    "slurm_setup": 'setup (a profile field: setup={"commands": [...]})',
    "slurm_job_name": "name",
    "max_num_timeout": 'requeue (a budget per cause, e.g. requeue={"timeout": 3})',
    "slurm_max_num_timeout": 'requeue (a budget per cause, e.g. requeue={"timeout": 3})',
    "slurm_use_srun": 'launcher ("srun" or "torchrun"; slurmkit always starts the ranks itself)',
    "cluster": 'profile (e.g. Executor(profile="local"))',
    "stderr_to_stdout": "none: every rank's stdout and stderr are kept apart (`slurmkit logs` marks stderr [N!])",
    "slurm_stderr_to_stdout": "none: every rank's stdout and stderr are kept apart (`slurmkit logs` marks stderr [N!])",
    "slurm_ntasks_per_node": "tasks_per_node",
    "slurm_num_gpus": "gpus_per_node",
    "slurm_dependency": "`slurmkit submit --after RUN` (a run, sweep or job id), or "
                        "sbatch_extra=[\"--dependency=afterok:123\"]",
    "slurm_srun_args": 'srun_args (the same list, e.g. srun_args=["--cpu-bind=cores"]), on the ranks\' step',
    "slurm_teardown": "none: end your function or command with its own cleanup",
    "slurm_exclusive": 'sbatch_args ({"exclusive": True})',
    **{f"slurm_{name}": f'sbatch_args ({{"{name}": ...}})'
       for name in ("comment", "mail_type", "mail_user", "mem_per_cpu", "nodelist", "wckey")},
}
"""submitit's executor parameters whose slurmkit name is not theirs without `slurm_`."""

EXECUTOR_METHODS = {
    "update_parameters": "update(**kw), which returns a new Executor (submitit's changes it in place)",
    "batch": "map_array(fn, items): one job array, as submitit's batch() makes",
    "submit_array": "map_array(fn, items)",
}

JOB_METHODS = {
    "task": "results(ranks=[i])[0]",
    "stdout": "logs() (every rank's lines; logs(rank=N) for one)",
    "stderr": "logs() (stderr lines are marked [N!]; logs(rank=N) for one)",
    "awaitable": "result(timeout=...) or slurmkit.as_completed(jobs)",
    "exception": "result(), which raises JobFailedError with the failing rank and its cause",
    "get_info": "state",
    "num_tasks": "results() (one value per rank)",
}


def keyword_hint(name: str, valid: list[str]) -> str | None:
    """slurmkit's name for submitit's executor keyword `name`, if it is one."""
    if name in EXECUTOR_KEYWORDS:
        return EXECUTOR_KEYWORDS[name]
    bare = name.removeprefix("slurm_")
    return bare if bare != name and bare in valid else None


def method_error(kind: str, name: str, table: dict[str, str]) -> AttributeError:
    """The AttributeError for `kind.name`, pointing at slurmkit's form where `name` is submitit's."""
    hint = table.get(name)
    tail = f": that is submitit's; slurmkit's is {hint} (docs/from-submitit.md)" if hint else ""
    return AttributeError(f"'{kind}' object has no attribute {name!r}{tail}")
