"""What every rank runs for the callable submitit carries (slurmkit.calls.Run): its spec, on this rank.

Kept free of torch at import time: shell-command and callable runs must not pay for it.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from slurmkit.common import outcomes, user_trace
from slurmkit.common.code_source import with_source
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import CommandStop
from slurmkit.common.slurm_env import slurm_job_id
from slurmkit.common.work import RayDriver, ShellCommand, Target, TrainTask
from slurmkit.supervisor import restarts
from slurmkit.worker import checkpoint, ray_driver, tracking
from slurmkit.worker.command import CommandFailed, run_command
from slurmkit.worker.ft import checkpointable
from slurmkit.worker.ft.watchdog import StartupWatch
from slurmkit.worker.interrupt import Interrupted, requeue_on_signal
from slurmkit.worker.process_group import detect, rank_env

if TYPE_CHECKING:  # the record imports this module where a rank calls it
    from slurmkit.calls import Run

STDERR_TAIL_BYTES = 64 * 1024


def run(call: Run) -> Any:
    """Run the call's spec on this rank; the rank's outcome goes to outcomes/ as JSON (a stop for
    requeue writes none)."""
    outcome_file, stderr_log = _rank_files(call.run_dir)
    try:
        value = _run(call)
    except Exception as exc:
        if isinstance(exc, CommandFailed):
            sys.stderr.flush()
            why, trace = user_trace.of_command(exc.returncode, _tail(stderr_log))
        else:
            why, trace = user_trace.of_exception(exc)
        outcomes.record(outcome_file, outcomes.ERROR, error=traceback.format_exc(), cause=why, trace=trace)
        raise
    outcomes.record(outcome_file, outcomes.SUCCESS, value=value)
    if not isinstance(call.work, TrainTask) and detect().rank == 0:  # a train task finishes its own
        tracking.finish_run(call.run_dir)
    return value


def train_task() -> ModuleType:
    """slurmkit.worker.train.tasks.train_task (torch): only a task run, or a standby rank getting
    ready for one, pays for it."""
    from slurmkit.worker.train.tasks import train_task as module

    return module


def _run(call: Run) -> Any:
    # slurmkit's own interpreters start with -P (or PYTHONSAFEPATH); the user's code keeps Python's rules.
    os.environ.pop("PYTHONSAFEPATH", None)
    os.environ.update(call.env)
    os.environ["SLURMKIT_RUN_DIR"] = call.run_dir
    if call.code_dir:  # the batch shell has done this on Slurm; the local executor has not
        os.chdir(call.code_dir)
        sys.path.insert(0, call.code_dir)
    if call.checkpoint_uri:
        os.environ["SLURMKIT_CHECKPOINT_URI"] = call.checkpoint_uri
    work = call.work
    if isinstance(work, TrainTask):  # its own stop and restart records
        StartupWatch.begin()  # from before torch's import to the first step (startup.first_step_hook)
        return train_task().run(work.config, call.run_dir)

    record_restart(call.run_dir)
    # A function's or command's own wandb.init() / mlflow.start_run() go on with the run's tracker runs
    os.environ.update(tracking.environment(call.run_dir, detect().rank))
    user_imports()
    with requeue_on_signal(call.run_dir):
        match work:
            case ShellCommand(command):
                return run_command(command, _command_marker(call.run_dir))
            case RayDriver(ray):
                return ray_driver.run(ray)
        # The env:// rendezvous variables, as a command gets them: a function that calls
        # init_process_group() (or runs a torchrun-style script in a subprocess) needs no slurmkit call.
        os.environ.update(rank_env(detect()))
        if isinstance(work, Target):
            return call_target(work.target, work.kwargs)
        paths = RunPaths(Path(call.run_dir))
        fn = with_source(work.fn, work.source)
        return call_function(*checkpointable.load(paths, fn, work.args, work.kwargs), paths)


def _rank_id() -> tuple[str, int]:
    """(job id, global rank), as submitit names this rank's result and logs."""
    import submitit

    env = submitit.JobEnvironment()
    return str(env.job_id), env.global_rank


def _rank_files(run_dir: str) -> tuple[Path, Path]:
    """This rank's outcome record and its stderr log."""
    paths = RunPaths(Path(run_dir))
    return paths.outcome_file(*_rank_id()), paths.rank_log(*_rank_id(), "err")


def _command_marker(run_dir: str) -> Path:
    """This rank's CommandStop marker, named as its outcome record is."""
    return CommandStop.prepared(RunPaths(Path(run_dir)), *_rank_id())


def _tail(path: Path, size: int = STDERR_TAIL_BYTES) -> str:
    """The last `size` bytes of a log, as text ("" where there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def record_restart(run_dir: str) -> None:
    """On a requeued incarnation, rank 0 appends the restart and its cause to run.json."""
    count = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if count and os.environ.get("SLURM_PROCID", "0") == "0" and os.environ.get("SUBMITIT_EXECUTOR") == "slurm":
        restarts.record_restart(RunPaths(Path(run_dir)), slurm_job_id(), count, None)


def user_imports() -> None:
    """The user's code imports from its working folder (the submit folder, or the snapshot), as it
    would under `python -m`; slurmkit's own imports are done by now (the interpreter ran with -P).
    The folder goes last, so a name planted there never shadows an installed package."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.append(here)


def call_target(target: str, kwargs: Mapping[str, object]) -> Any:
    """A spec's `callable: module:function`, imported by the user's rules (user_imports)."""
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj(**kwargs)


def call_function(fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, object], paths: RunPaths | None = None) -> Any:
    """A function from slurmkit.Executor. A parameter annotated slurmkit.Checkpoint gets the run's
    Checkpoint; a process group it brought up (slurmkit.distributed) is left together once it
    returns (or stops at an agreed step), and torn down however it ends. A submitit Checkpointable
    stopped for a requeue is asked for its next call (slurmkit.worker.ft.checkpointable)."""
    name = checkpoint.wants_checkpoint(fn)
    ckpt = checkpoint.default() if name else None
    try:
        value = fn(*args, **{**kwargs, name: ckpt}) if name else fn(*args, **kwargs)
        checkpoint.finish()
    except BaseException as exc:
        if paths is not None and isinstance(exc, Interrupted) and exc.requeue:
            checkpointable.save(paths, fn, args, kwargs)
        _leave_group(together=isinstance(exc, checkpoint.AgreedStop))
        raise
    _leave_group(together=True)
    return value


def _leave_group(together: bool) -> None:
    dist = sys.modules.get("slurmkit.worker.distributed")
    if dist is None:
        return
    if together:
        dist.shutdown()
    else:
        dist.abandon()
