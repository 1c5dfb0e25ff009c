"""Submit's one direction: a resolved spec and profile -> `build` -> one typed SubmitRequest (the
job's shape, the supervisor's plan, the script) -> the Slurm client sends it (slurm.submitit_executor).

`build` is pure: it renders templates, and calls no Slurm daemon, writes nothing and starts
nothing. The dry run (`slurmkit render`, `submit --dry-run`, Executor.dry_run) returns the very
value that submit then sends, as TorchX's dry run does.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from slurmkit.common.layout import RunPaths, expand_root
from slurmkit.common.supervisor_plan import Health, PartPlan, Plan, Shrink
from slurmkit.config.resolved import Resolved
from slurmkit.config.shape import Shape
from slurmkit.render import JobFiles, RenderInput, container_context, render, shell_quote
from slurmkit.stage.envpack import EnvImage, StageError, identify

SAFE_PATH = "-P"
"""Every interpreter slurmkit starts runs with -P (Python 3.11+): it never imports from the working
folder, where another user may have planted a `submitit.py` or `slurmkit/`. A user's own command
keeps Python's usual rules (slurmkit.worker.rank drops PYTHONSAFEPATH before any user code runs)."""
RANK_MODULE = "slurmkit.worker.rank"
"""Each rank's main module: submitit's worker, then an exit without Python's finalization."""
STANDBY_MODULE = "slurmkit.worker.standby"


@dataclass(frozen=True)
class ArraySpec:
    """One sbatch job array: task i of the array is sweep task base + i (when it belongs to a sweep)."""

    array: str
    """The --array value, e.g. 0-5%2."""
    task_ids: list[int]
    base: int = 0
    sweep_dir: str | None = None
    """The sweep whose tasks these are; None for an array whose tasks share the run folder."""
    pickle: str | None = None
    """A sweep array's one pickle, written before sbatch; each task links it under its own job id when it starts."""


@dataclass(frozen=True)
class SubmitRequest:
    """What one sbatch sends, built once: the dry run shows it, submit sends it byte for byte."""

    resolved: Resolved
    job_folder: Path
    """submitit's folder, inside the run (or sweep) folder."""
    plan: Plan | None
    """The job's supervisor's plan (None for a Ray run, whose driver owns its recovery)."""
    script: str
    dependency: str | None = None
    array: ArraySpec | None = None
    stage: EnvImage | None = None
    """The environment staged to the nodes (profile stage.env): packed when this request is sent."""

    @property
    def shape(self) -> Shape:
        """The job's nodes and tasks (config.shape), as the script asks for them."""
        return self.resolved.shape

    @property
    def run_paths(self) -> RunPaths:
        return RunPaths(self.job_folder.parent)


def python_command(resolved: Resolved) -> str:
    """The interpreter on the host (and -P): the supervisor and the batch shell's helpers, and the
    ranks when there is no container."""
    return f"{shell_quote(resolved.profile.python or sys.executable)} {SAFE_PATH}"


def rank_python(resolved: Resolved) -> str:
    """The interpreter that runs each rank (and -P): the container's, if it names one."""
    c = resolved.profile.container
    return f"{shell_quote(c.python)} {SAFE_PATH}" if c is not None and c.python else python_command(resolved)


def submitit_command(python: str, folder: Path) -> str:
    """The command each rank runs: submitit's worker (`submitit.core._submit`, as submitit's own
    SlurmExecutor._submitit_command_str) inside slurmkit.worker.rank."""
    return " ".join([python, f"-u -m {RANK_MODULE}", shell_quote(str(folder))])


def job_files(paths: RunPaths, array: bool = False) -> JobFiles:
    """Log patterns in submitit's JobPaths layout (common.layout's rank_log), so submitit's own
    stdout()/stderr() find them: the batch step's is rank 0's."""
    job = "%A_%a" if array else "%j"
    return JobFiles(*(str(paths.rank_log(job, rank, stream)) for rank in ("0", "%t") for stream in ("out", "err")))


def torchrun_node(resolved: Resolved, job_folder: str) -> str:
    """`bash -c` for each node's srun task under `launcher: torchrun`: torchrun starts the node's
    ranks (slurmkit.worker.torchrun_rank, then submitit's worker).

    Slurm delivers a step's signals to every process of the step (whichever proctrack plugin), so
    the ranks get the requeue signal and SIGTERM straight from Slurm. torchrun must not die of the
    requeue signal (its default action for USR1 and USR2), which would end the node's task non-zero
    under the ranks' save: it starts with that signal ignored, and each rank sets it back to the
    default before its own handler goes in. For TERM, INT and HUP torchrun has its own handler,
    which passes the signal on and waits up to 30 s for its ranks."""
    # PYTHONSAFEPATH: torchrun starts each rank as `python -u -m MODULE`; the rank drops it again.
    return (f"trap '' {resolved.profile.signal}; "
            f"PYTHONSAFEPATH=1 exec {rank_python(resolved)} -m torch.distributed.run --nnodes=\"$SLURM_JOB_NUM_NODES\" "
            f"--nproc-per-node={resolved.shape.tasks_per_node:d} --rdzv-backend=c10d "
            '--rdzv-endpoint="$SLURMKIT_RDZV_ENDPOINT" --rdzv-id="$SLURM_JOB_ID.$SLURMKIT_ATTEMPT" --max-restarts=0 '
            f"-m slurmkit.worker.torchrun_rank {shell_quote(job_folder)}")


def standby_command(resolved: Resolved, job_folder: str, container: Mapping[str, object]) -> list[str] | None:
    """The standby ranks' argv (slurmkit.worker.standby; the supervisor adds --run-dir and --attempt),
    where the profile asks for them and the next in-job step is the same srun of submitit's worker."""
    policy = resolved.profile.requeue
    if not (policy.standby and policy.in_job > 0) or resolved.spec.ray or resolved.spec.launcher == "torchrun" \
            or resolved.shape.shrinks or container["srun"] or container["prefix"]:
        return None
    compiled = ["--compile"] if resolved.spec.task == "train" and resolved.spec.config.get("compile") else []
    return [*shlex.split(rank_python(resolved)), "-u", "-m", STANDBY_MODULE, *compiled, job_folder]


def supervisor_plan(resolved: Resolved, job_folder: Path, files: JobFiles) -> Plan | None:
    """What the job's supervisor runs (slurmkit.common.supervisor_plan); None for a Ray run."""
    if resolved.spec.ray:
        return None
    prof, shape = resolved.profile, resolved.shape
    container = container_context(resolved, str(job_folder.parent))
    torchrun = resolved.spec.launcher == "torchrun"
    gate = prof.health_gate == "always" or (prof.health_gate == "gpu" and bool(resolved.node_gpus))
    command = submitit_command(rank_python(resolved), job_folder)
    return Plan(
        signal=prof.signal, launcher="torchrun" if torchrun else "srun",
        command=["bash", "-c", torchrun_node(resolved, str(job_folder))] if torchrun else shlex.split(command),
        stdout=files.rank_stdout, stderr=files.rank_stderr, tasks_per_node=shape.tasks_per_node,
        in_job=prof.requeue.in_job, srun_args=resolved.srun_args,
        budgets=prof.requeue.model_dump(include={"preemption", "timeout", "node_failure", "hang", "crash"}),
        standby=standby_command(resolved, str(job_folder), container),
        shrink=Shrink(nodes=shape.nodes, least=shape.least) if shape.shrinks else None,
        health=Health(python=shlex.split(python_command(resolved)), gpus=resolved.node_gpus,
                      allreduce=prof.health_allreduce) if gate else None)


def parts_plan(resolved: Resolved, job_folder: Path) -> Plan:
    """A heterogeneous job's plan: each part's step (its own run folder's submitit worker and logs),
    on the primary part's plan (signal, budgets), which has no standby step and no health gate."""
    top = job_folder.parent
    parts, primary = [], None
    for part in resolved.parts:
        paths = RunPaths(top).part(part.name, part.primary)
        own = supervisor_plan(part.resolved, paths.job_folder, job_files(paths))
        assert own is not None
        parts.append(PartPlan(name=part.name, run_dir=str(paths.run_dir), command=own.command, stdout=own.stdout,
                              stderr=own.stderr, tasks_per_node=own.tasks_per_node, srun_args=own.srun_args,
                              nodes=part.resolved.shape.nodes, gpus_per_node=part.resolved.node_gpus,
                              primary=part.primary))
        primary = own if part.primary else primary
    assert primary is not None
    return primary.model_copy(update={"standby": None, "health": None, "parts": parts})


def build(resolved: Resolved, job_folder: Path, array: ArraySpec | None = None,
          dependency: str | None = None) -> SubmitRequest:
    """The one request for a run (or a sweep's array) whose submitit folder is `job_folder`."""
    sweep = {"dir": array.sweep_dir, "base": array.base, "pickle": array.pickle} if array and array.sweep_dir else None
    files = job_files(RunPaths(job_folder.parent), array is not None)
    stage = env_stage(resolved)
    plan = parts_plan(resolved, job_folder) if resolved.parts else supervisor_plan(resolved, job_folder, files)
    if plan is not None and stage is not None:
        plan = plan.model_copy(update={"staged_from": shlex.split(python_command(resolved))[0]})
    run_dir = str(job_folder.parent)
    script = render(RenderInput(
        resolved, submitit_command(rank_python(resolved), job_folder), files, python_command(resolved), run_dir,
        plan=plan, array=array.array if array else None, dependency=dependency, sweep=sweep,
        code_dir=str(RunPaths(job_folder.parent).code_dir) if resolved.snapshot else None,
        rank_python=rank_python(resolved), stage=stage))
    return SubmitRequest(resolved, job_folder, plan, script, dependency, array, stage)


def env_stage(resolved: Resolved) -> EnvImage | None:
    """The environment to stage (profile stage.env), as it would be packed; a profile's `stage` is
    refused in one line where the run cannot be staged."""
    prof, spec = resolved.profile, resolved.spec
    if not (prof.stage.env or prof.stage.data):
        return None
    contained = prof.container is not None or any(p.resolved.profile.container for p in resolved.parts)
    refused = ("the local profile runs on this machine's own disk: there is no node to stage to"
               if prof.executor != "slurm" else
               "a container brings its own environment" if contained and prof.stage.env else
               "a Ray run is not staged yet" if spec.ray else
               "launcher: torchrun is not staged yet (launcher: srun is)" if spec.launcher == "torchrun" else None)
    if refused:
        raise StageError(refused, where="profile.stage", valid="valid: no stage section for this run")
    return identify(expand_root(prof.run_root), prof.python) if prof.stage.env else None
