"""submitit integration: submitit pickles the callable and owns the job folder, but the sbatch
text it submits is our Jinja render.

The hook is submitit's private `_make_submission_file_text`; pyproject pins submitit to a tested
range and tests/unit/test_executor_hook.py fails if the hook stops being used.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import submitit
import submitit.local as submitit_local
from submitit.core.utils import DelayedSubmission, JobPaths

from slurmkit import trust
from slurmkit.build import SubmitRequest, python_command, rank_python, submitit_command
from slurmkit.common import perms, ports
from slurmkit.common.atomic import atomic_write, atomic_write_text
from slurmkit.common.layout import RunPaths
from slurmkit.common.slurm_env import outer_job_env, rank_env
from slurmkit.config.fields import time_to_minutes
from slurmkit.config.resolved import Resolved
from slurmkit.errors import SlurmkitError
from slurmkit.slurm import commands
from slurmkit.stage import staging

NO_LIMIT_MIN = 366 * 24 * 60


def job_env_unset(environ: dict[str, str]) -> list[str]:
    """`env -u NAME ...` for the variables of the job this process runs in (none outside a job)."""
    names = outer_job_env(environ)
    return ["env", *(a for k in names for a in ("-u", k))] if names else []


def own_environ() -> dict[str, str]:
    """This process's environment without the variables of the job it runs in (none outside one):
    what a job started from here gets, so that it never joins the outer one's run (common.slurm_env)."""
    outer = set(outer_job_env(dict(os.environ)))
    return {k: v for k, v in os.environ.items() if k not in outer}


def resubmit(paths: RunPaths, job_id: str, script: str, partition: str | None = None,
             parts: tuple[RunPaths, ...] = ()) -> str:
    """sbatch a run's recorded script again; the new job's call is job `job_id`'s pickle, copied
    (never unpickled here) under the new id (submitit's worker waits up to 60 s for it), and so is
    each of a heterogeneous run's other `parts`' in its own folder. `partition` overrides the
    script's. Returns the new job id."""
    folders = [paths.job_folder, *(p.job_folder for p in parts)]
    calls = [_call_bytes(RunPaths(folder.parent), job_id) for folder in folders]
    tag = uuid.uuid4().hex
    tmp_script = paths.job_folder / f".resubmit-{tag}.sh"
    tmp_pickles = [folder / f".{tag}.pkl" for folder in folders]
    env = own_environ()
    mode = perms.file_mode(paths.run_dir)
    try:
        atomic_write_text(tmp_script, script, mode, durable=False)
        for tmp, call in zip(tmp_pickles, calls, strict=True):
            atomic_write(tmp, call, mode, durable=False)
        new = commands.sbatch(str(tmp_script), [f"--partition={partition}"] if partition else [], env)
        for folder, tmp in zip(folders, tmp_pickles, strict=True):
            JobPaths(folder, job_id=new).move_temporary_file(tmp, "submitted_pickle")
    finally:
        tmp_script.unlink(missing_ok=True)
        for tmp in tmp_pickles:
            tmp.unlink(missing_ok=True)
    return new


def resubmit_local(paths: RunPaths, job_id: str, resolved: Resolved) -> str:
    """Start a local run's ranks again as a new local job (a new controller) on job `job_id`'s
    pickle, copied (never unpickled here) under the new id. Returns the new job id."""
    call = _call_bytes(paths, job_id)
    ex = local_executor(paths.job_folder, resolved)
    job = ex._submit_command(ex._submitit_command_str)  # what submitit's own submit starts, without a pickle
    new = str(job.job_id)
    atomic_write(JobPaths(paths.job_folder, job_id=new).submitted_pickle, call, perms.file_mode(paths.run_dir))
    return new


def _call_bytes(paths: RunPaths, job_id: str) -> bytes:
    """Job `job_id`'s pickled call, read from the open file of the caller's own pickle: never another user's."""
    old = JobPaths(paths.job_folder, job_id=job_id).submitted_pickle
    try:
        with os.fdopen(trust.open_own(old), "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise SlurmkitError(f"job {job_id}'s call is gone ({old})", where=paths.run_id,
                            valid="submit the run again with `slurmkit submit`") from None


def place_call(folder: Path, job_id: str, fn: Any, executor: Any) -> None:
    """Another part's call of a heterogeneous job (spec components), pickled as submitit pickles the
    job's own, under submitit's name for job `job_id` in that part's job folder, where its ranks'
    worker (which waits for it) loads it. Written aside and renamed: never seen half-written."""
    folder.mkdir(mode=0o700, exist_ok=True)
    delayed = DelayedSubmission(fn)
    delayed.set_timeout(executor.parameters.get("time", 5), executor.max_num_timeout)
    tmp = folder / f".{uuid.uuid4().hex}.pkl"
    try:
        delayed.dump(tmp)
        JobPaths(folder, job_id=job_id).move_temporary_file(tmp, "submitted_pickle")
    finally:
        tmp.unlink(missing_ok=True)


class RenderedSlurmExecutor(submitit.SlurmExecutor):
    """A SlurmExecutor whose submission file is a built request's script (build.build), sent as it is."""

    def __init__(self, request: SubmitRequest) -> None:
        resolved = request.resolved
        if request.stage is not None:  # the image the script stages must be there before it is queued
            staging.pack_said(request.stage)
        super().__init__(request.job_folder, max_num_timeout=resolved.profile.requeue.timeout,
                         python=rank_python(resolved))
        self.request = request
        self.last_script: str | None = None
        self.before_sbatch: Callable[[Path], None] | None = None
        """Called with the script's path just before sbatch runs (sweeps.arrays records its name)."""
        assert resolved.resources.time is not None
        # submitit reads these for the task count and its own timeout bookkeeping; the script
        # itself is the request's.
        self.update_parameters(nodes=request.shape.nodes, ntasks_per_node=request.shape.tasks_per_node,
                               time=time_to_minutes(resolved.resources.time))

    def _num_tasks(self) -> int:
        return self.request.shape.num_tasks  # a Ray run has one submitit task (the driver) over N nodes

    @property
    def _submitit_command_str(self) -> str:
        return submitit_command(self.python, Path(self.folder))

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        self.last_script = self.request.script
        return self.last_script

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        # submitit runs this itself without a timeout; coreutils timeout bounds a hung slurmctld.
        argv = [*job_env_unset(dict(os.environ)), "timeout",
                f"--kill-after={commands.SBATCH_KILL_AFTER_S}", str(commands.SBATCH_TIMEOUT_S), "sbatch",
                str(submission_file_path)]
        commands.CALLS["sbatch"] += 1
        if self.before_sbatch is not None:
            self.before_sbatch(submission_file_path)
        return argv

    def submit_sweep_array(self, fn: Any) -> str:
        """The request's job array (its `array` set), whose tasks all run `fn`, which finds its own
        config from its array index; returns the array's job id.

        One pickle serves every task: written once, before sbatch, at array.pickle, and linked
        under submitit's name for a task by that task's batch shell (slurmkit.worker.sweep_task). A
        100,000-task sweep costs one pickling and no file per task at submit time.
        """
        array = self.request.array
        assert array is not None and array.pickle is not None
        Path(array.pickle).parent.mkdir(parents=True, exist_ok=True)
        delayed = DelayedSubmission(fn)
        delayed.set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
        delayed.dump(Path(array.pickle))
        try:
            return str(self._submit_command(self._submitit_command_str).job_id)
        except BaseException:
            Path(array.pickle).unlink(missing_ok=True)
            raise

    def _internal_process_submissions(self, delayed_submissions: list[DelayedSubmission]) -> list[submitit.Job[Any]]:
        # One request is one sbatch: a job, or a sweep's array (submit_sweep_array). submitit's own
        # batch would need a script built for an array; slurmkit's map_array builds one (a sweep).
        if len(delayed_submissions) != 1 or self.request.array is not None:
            raise SlurmkitError("one built request submits one job", where="RenderedSlurmExecutor",
                                valid="valid: slurmkit.Executor.map_array for an array of calls")
        return super()._internal_process_submissions(delayed_submissions)


class SafeLocalExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor, whose controller (`python -m submitit.local._local`) starts with
    PYTHONSAFEPATH: it never imports from the working folder. Its ranks are slurmkit.worker.rank
    (with -P from `python`), which loads the job's pickle only from a file of the caller's own, as
    on Slurm."""

    rank_env: dict[str, str] = {}
    """What a Slurm job's batch script exports for the ranks from the profile (local_executor sets it)."""

    @property
    def _submitit_command_str(self) -> str:
        return submitit_command(self.python, self.folder)

    def _internal_process_submissions(self, delayed_submissions: list[DelayedSubmission]) -> list[submitit.Job[Any]]:
        # Started from inside a run (a nested pipeline), the job gets none of that run's variables.
        with _environ(PYTHONSAFEPATH="1"), _without(outer_job_env(dict(os.environ))):
            return super()._internal_process_submissions(delayed_submissions)

    def _submit_command(self, command: str) -> Any:
        # Each job (each task of a local array too) its own rendezvous port, free when it starts
        # (common/ports.py): a pid-derived one could be a Slurm job's on the same host.
        with _environ(MASTER_PORT=str(ports.free_local_port()), **self.rank_env), _detached_stdio(), _own_session():
            return super()._submit_command(command)


class _SessionSubprocess:
    """The `subprocess` module as submitit's local module sees it while it starts a controller: every
    process it starts leads a session (and process group) of its own, so the job's whole tree (the
    controller, its ranks, the processes a rank's command starts) is one group that a cancel ends
    (runs.procs.end_group), and no terminal's signal reaches it."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - subprocess's name
        return subprocess.Popen(*args, **kwargs, start_new_session=True)


@contextlib.contextmanager
def _own_session() -> Iterator[None]:
    module = submitit_local.local
    saved = module.subprocess
    module.subprocess = _SessionSubprocess()  # type: ignore[assignment]
    try:
        yield
    finally:
        module.subprocess = saved


@contextlib.contextmanager
def _detached_stdio() -> Iterator[None]:
    """The controller starts with /dev/null for stdin, stdout and stderr (its ranks write to the
    job folder): a detached job must not hold the submitting command's terminal or pipes, or an
    `ssh HOST slurmkit submit` (slurmkit.remote) would not end until the job does."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        yield
    finally:
        for fd, copy in zip((0, 1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(null)


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """os.environ with `values` set while submitit starts its controller (which copies it)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _without(names: list[str]) -> Iterator[None]:
    """os.environ without `names` while submitit starts its controller (which copies it)."""
    before = {k: os.environ.pop(k) for k in names if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(before)


def local_executor(folder: Path, resolved: Resolved) -> Any:
    """submitit's LocalExecutor (SafeLocalExecutor): every rank a process on this machine."""
    ex = SafeLocalExecutor(folder, max_num_timeout=resolved.profile.requeue.timeout,
                           python=python_command(resolved))
    ex.rank_env = rank_env(resolved.profile.startup_timeout_s, resolved.profile.straggler_score)
    r = resolved.resources
    assert r.time is not None
    # On Slurm a time of 0 means no limit; submitit's local executor would kill the job at once.
    timeout_min = time_to_minutes(r.time) or NO_LIMIT_MIN
    # submitit sets CUDA_VISIBLE_DEVICES to the first gpus_per_node GPUs, to none when there are none
    ex.update_parameters(tasks_per_node=resolved.shape.num_tasks, timeout_min=timeout_min,
                         gpus_per_node=resolved.node_gpus, signal_delay_s=resolved.profile.signal_delay_s)
    return ex


_STARTED: list[subprocess.Popen[bytes]] = []
"""The local heterogeneous runs' supervisors this process started (kept, as submitit keeps its
controllers, so that none is reported still running when its Popen is collected)."""


class LocalPartsExecutor:
    """A heterogeneous run on the local profile: its script (`exec` of its supervisor,
    slurmkit.supervisor.local_parts) started detached in a session of its own (a cancel ends that
    group: every part's ranks), its pid the run's job id; every part's call is pickled under it, as
    on Slurm (place_call). The script is recorded as a Slurm run's is: a resubmit starts it again."""

    def __init__(self, request: SubmitRequest) -> None:
        resolved, plan = request.resolved, request.plan
        assert plan is not None and resolved.resources.time is not None
        self.resolved, self.paths = resolved, RunPaths(request.job_folder.parent)
        self.parameters: dict[str, Any] = {}
        self.max_num_timeout = resolved.profile.requeue.timeout
        argv = [*shlex.split(python_command(resolved)), "-m", "slurmkit.supervisor.local_parts",
                "--run-dir", str(self.paths.run_dir), "--plan", plan.model_dump_json(),
                "--time-s", str(60 * time_to_minutes(resolved.resources.time)),
                "--signal-delay-s", str(resolved.profile.signal_delay_s)]
        # In the submit's folder, as sbatch starts a job: a resubmit from elsewhere runs the same commands.
        self.last_script = ("#!/bin/bash\n# A heterogeneous run on the local profile: its parts' supervisor "
                            f"(slurmkit.supervisor.local_parts)\ncd -- {shlex.quote(os.getcwd())} || exit 1\n"
                            f"exec {shlex.join(argv)}\n")

    def submit(self, fn: Any) -> Any:
        job_id = start_local_parts(self.paths, self.last_script, self.resolved)
        place_call(self.paths.job_folder, job_id, fn, self)
        return types.SimpleNamespace(job_id=job_id)


def start_local_parts(paths: RunPaths, script: str, resolved: Resolved) -> str:
    """Start a local heterogeneous run's script detached (its lines to the job folder's
    local_supervisor_log), with what the ranks get from the profile; its pid, the job id."""
    env = own_environ()  # (the outer job's variables computed once, not once a variable)
    env.update(rank_env(resolved.profile.startup_timeout_s, resolved.profile.straggler_score))
    paths.job_folder.mkdir(mode=0o700, exist_ok=True)
    log = os.open(paths.local_supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:  # bash execs the supervisor: its pid stays the job's
        proc = subprocess.Popen(["bash", "-c", script], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                start_new_session=True)
    finally:
        os.close(log)
    _STARTED.append(proc)
    return str(proc.pid)


def resubmit_local_parts(paths: RunPaths, job_id: str, script: str, parts: tuple[RunPaths, ...],
                         resolved: Resolved) -> str:
    """Start a local heterogeneous run's recorded script again; every part's call is job `job_id`'s,
    copied (never unpickled here) under the new id. Returns the new job id."""
    calls = [_call_bytes(p, job_id) for p in (paths, *parts)]
    new = start_local_parts(paths, script, resolved)
    for p, call in zip((paths, *parts), calls, strict=True):
        atomic_write(JobPaths(p.job_folder, job_id=new).submitted_pickle, call, perms.file_mode(paths.run_dir))
    return new
