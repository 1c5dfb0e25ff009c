"""Sweeps on the `local` profile: a detached runner puts each task through submitit's LocalExecutor,
at most max_parallel at a time, so `slurmkit sweep` returns at once as it does on Slurm.

    python -m slurmkit.sweeps.local --sweep-dir DIR --array N
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from slurmkit import trust
from slurmkit.calls import SweepTask
from slurmkit.common.locked import try_lock
from slurmkit.common.record import RunFile
from slurmkit.common.sweep_layout import ArrayEntry, ArrayLog, Manifest, SweepPaths, materialize_task
from slurmkit.runs.procs import same_process, start_time
from slurmkit.slurm.submitter import submitter
from slurmkit.sweeps import hetjobs
from slurmkit.sweeps.store import manifest_tasks

POLL_S = 0.5


def start(paths: SweepPaths, indices: list[int]) -> int:
    """Record a local "array" for `indices` and launch its runner in its own session; returns its pid."""
    with ArrayLog(paths).editing() as log:
        number = len(log.arrays)
        log.arrays.append(ArrayEntry(kind="local", indices=indices))
    return _launch(paths, number)


def _launch(paths: SweepPaths, number: int) -> int:
    """Start array `number`'s runner. It inherits the array's lock, taken here before it starts, so
    the lock is held while the starter or the runner lives (BlockingIOError: it is held now)."""
    lock = try_lock(paths.runner_lock(number))
    try:
        with os.fdopen(trust.open_append(paths.local_runner_log, 0o600), "a") as out:  # handed to the child
            proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "slurmkit.sweeps.local", "--sweep-dir", str(paths.sweep_dir),
                 "--array", str(number)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                pass_fds=(lock,))
    finally:
        os.close(lock)
    _record_runner(paths, number, proc.pid)
    return proc.pid


def _record_runner(paths: SweepPaths, number: int, pid: int) -> None:
    with ArrayLog(paths).editing() as log:
        log.arrays[number].runner_pid, log.arrays[number].runner_start = pid, start_time(pid)


def recover(paths: SweepPaths) -> list[int]:
    """Local arrays whose runner was never started (their starter killed between the entry's write
    and the runner's start: the array's lock is free and no runner is recorded) get one now; their
    numbers. A runner that started but was not recorded holds the lock, and records itself."""
    started = []
    for number, arr in enumerate(ArrayLog(paths).read().arrays):
        if arr.kind == "local" and arr.runner_pid is None:
            with contextlib.suppress(BlockingIOError):
                _launch(paths, number)
                started.append(number)
    return started


def run(paths: SweepPaths, number: int) -> None:
    """Run the tasks of local array `number`, at most max_parallel at once; each job's pid goes to the array log."""
    manifest = Manifest(paths).read()
    if manifest.arrays[number].runner_pid is None:  # its starter died before it could record this runner
        _record_runner(paths, number, os.getpid())
    groups, group_of = manifest_tasks(manifest)
    het = hetjobs.heterogeneous(manifest)
    queue = list(manifest.arrays[number].indices)
    limit = manifest.max_parallel or len(queue)
    running: list[tuple[str, int | None]] = []
    while queue or running:
        running = [(job, start) for job, start in running if not _ended(job, start)]
        while queue and len(running) < limit:
            i = queue.pop(0)
            if het:  # its own local heterogeneous run (supervisor.local_parts)
                job_id = hetjobs.submit_one(paths, manifest, i)
                pid_start = RunFile(paths.task(i)).read().pid_starts.get(job_id)
            else:
                task = materialize_task(paths, i, "", manifest)
                executor = submitter().local_executor(task.job_folder, groups[group_of[i]])
                job_id = str(executor.submit(SweepTask(str(paths.sweep_dir), index=i)).job_id)
                pid_start = start_time(int(job_id))
                RunFile(task).add_job_id(job_id, pid_start)
            with ArrayLog(paths).editing() as log:
                log.arrays[number].jobs[str(i)] = job_id
                log.arrays[number].job_starts[str(i)] = pid_start
            print(f"task {i}: job {job_id}", flush=True)
            running.append((job_id, pid_start))
        time.sleep(POLL_S)


def _ended(job_id: str, start: int | None) -> bool:
    """A task's job (a child of this runner) has ended: reaped here, so that no zombie stays."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(int(job_id), os.WNOHANG)
    return not same_process(job_id, start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmkit.sweeps.local")
    parser.add_argument("--sweep-dir", required=True)
    parser.add_argument("--array", type=int, required=True)
    args = parser.parse_args(argv)
    run(SweepPaths(Path(args.sweep_dir)), args.array)
    return 0


if __name__ == "__main__":
    sys.exit(main())
