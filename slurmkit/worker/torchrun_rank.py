"""One rank started by torchrun (`launcher: torchrun`): it becomes the Slurm task of its rank, then
runs submitit's worker, as srun's tasks do.

    python -m slurmkit.worker.torchrun_rank FOLDER

torchrun starts `tasks_per_node` of these on each node, inside that node's one srun task, so
their SLURM_PROCID is the node's. submitit names results and logs by SLURM_PROCID, and
slurmkit's requeue acts on rank 0's: each rank takes torchrun's RANK, LOCAL_RANK and WORLD_SIZE
as SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS, and writes to submitit's log files for that rank.
torchrun's own variables (TORCHELASTIC_RUN_ID, MASTER_ADDR, ...) stay: slurmkit.worker.process_group
detects a torchrun rank first.

torchrun starts with the requeue signal ignored (see slurmkit.render.torchrun_node), and an
ignored signal stays ignored across exec: each rank sets it back to the default, so that it acts
as under srun until the worker's handler is in.
"""

from __future__ import annotations

import os
import signal
import sys

from slurmkit import trust

RANK_MODULE = "slurmkit.worker.rank"
"""What each rank execs into (build.RANK_MODULE, held equal by tests/unit/test_rank_exit.py)."""


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or "RANK" not in os.environ:
        sys.exit("usage: torchrun ... -m slurmkit.worker.torchrun_rank FOLDER (RANK comes from torchrun)")
    folder = args[0]
    requeue_signal = os.environ.get("SLURMKIT_SIGNAL", "")
    if requeue_signal:
        signal.signal(signal.Signals[f"SIG{requeue_signal}"], signal.SIG_DFL)
    os.environ.update(SLURM_PROCID=os.environ["RANK"], SLURM_LOCALID=os.environ.get("LOCAL_RANK", "0"),
                      SLURM_NTASKS=os.environ.get("WORLD_SIZE", "1"))
    import submitit
    from submitit.core.utils import JobPaths

    env = submitit.JobEnvironment()
    paths = JobPaths(folder, job_id=str(env.job_id), task_id=env.global_rank)
    for fd, path in ((1, paths.stdout), (2, paths.stderr)):
        out = trust.open_append(path, 0o600)
        os.dup2(out, fd)
        os.close(out)
    os.execv(sys.executable, [sys.executable, "-P", "-u", "-m", RANK_MODULE, folder])


if __name__ == "__main__":
    main()
