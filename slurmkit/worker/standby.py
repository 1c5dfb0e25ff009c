"""Standby ranks: a second set of rank processes, started in the allocation beside the running
ranks, that has paid for its imports (torch, torch._dynamo, slurmkit's training code, submitit)
before it is needed. An in-job restart (a killed or hung rank: the cold path) hands its attempt to
them, so what that restart costs past the failure is the rendezvous and the restore, not fresh
interpreters (`import torch` plus `torch._dynamo` is ~4 s on the dev cluster's machine).

The job's supervisor (slurmkit.supervisor.loop) starts them as their own srun step with the
ranks' shape (`--overlap`: they share the ranks' CPUs) right after each step of the ranks starts.
Each process:
1. ignores the requeue signal, which Slurm delivers to every step's processes: it is not training;
2. lowers its CPU priority while it imports, so the running ranks keep the CPUs;
3. waits for its attempt's go file (RunPaths.standby_go), which the requeue policy (run by the
   supervisor after the ranks' srun failed) writes when it chooses an in-job restart;
4. then takes back its priority where the system lets it, sets SLURMKIT_ATTEMPT, and runs
   submitit's worker for the job folder in itself, exactly as a fresh rank would
   (slurmkit.worker.rank, which ends the process as a rank's).
When the job's last step of ranks ends, the supervisor ends the standby step.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from slurmkit.common import outcomes
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import StandbyGo
from slurmkit.common.slurm_env import slurm_job_id
from slurmkit.worker import (
    entry,  # what the pickled call runs: imported before the go, as the rest
    rank,
    startup,
)
from slurmkit.worker.ft.stop import requeue_signal

POLL_S = 0.01
NICE = 10


def _prepare(compiled: bool) -> float:
    """The imports a rank pays before its first step; seconds they took."""
    t0 = time.time()
    import submitit  # noqa: F401
    import torch._dynamo  # noqa: F401 - torch, and what the optimizer's constructor imports: ~2 s more

    entry.train_task()

    if compiled:  # what config.compile's first call imports (inductor): ~0.8 s more
        import torch._inductor.compile_fx  # noqa: F401
    return time.time() - t0


def ready_line(attempt: int) -> str:
    """What a standby rank says in its rank's log once its imports are paid (benchmarks wait on it)."""
    return f"standby rank for in-job attempt {attempt} ready"


def _renice(priority: int) -> bool:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, priority)
        return True
    except OSError:  # lowering the niceness again needs CAP_SYS_NICE (or RLIMIT_NICE)
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m slurmkit.worker.standby")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--attempt", type=int, required=True, help="the in-job attempt these ranks take over")
    parser.add_argument("--compile", action="store_true", help="the run compiles (config.compile): import inductor")
    parser.add_argument("folder", help="submitit's job folder")
    args = parser.parse_args(argv)
    stop_signal = requeue_signal()
    signal.signal(stop_signal, signal.SIG_IGN)
    priority = os.getpriority(os.PRIO_PROCESS, 0)
    _renice(priority + NICE)
    paid = _prepare(args.compile)
    paths, go = RunPaths(Path(args.run_dir)), StandbyGo(slurm_job_id(), outcomes.restart_count(), args.attempt)
    print(f"slurmkit: {ready_line(args.attempt)} ({paid:.1f} s of imports)",
          file=sys.stderr, flush=True)
    while not go.given(paths):
        time.sleep(POLL_S)
    renice = "" if _renice(priority) else f" (still at nice +{NICE}: no permission to lower it again)"
    signal.signal(stop_signal, signal.SIG_DFL)
    os.environ[outcomes.ATTEMPT_ENV] = str(args.attempt)

    startup.restart_clock()
    print(f"slurmkit: standby rank takes in-job attempt {args.attempt} (its imports took {paid:.1f} s "
          f"before){renice}", file=sys.stderr, flush=True)
    rank.run(args.folder)


if __name__ == "__main__":
    main()
