"""A job's rank processes on the dev cluster, whose nodes all share this machine's process table:
what the fault tests and benchmarks signal (kill -9, SIGSTOP) to fault one rank."""

from __future__ import annotations

from pathlib import Path

from slurmkit.build import RANK_MODULE
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import StandbyGo


def _environ(pid: Path) -> dict[str, str]:
    pairs = (item.split(b"=", 1) for item in (pid / "environ").read_bytes().split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def rank_pid(paths: RunPaths, rank: int) -> int:
    """The pid of the run's rank `rank` now: a fresh rank process (submitit's worker), or a standby
    process (slurmkit.worker.standby) whose attempt was handed to it; never one still waiting."""
    folder = str(paths.job_folder)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            env = _environ(proc) if folder in argv else {}
        except OSError:  # gone meanwhile, or not ours
            continue
        # srun's own argv names the rank module too, and the batch step's environment holds
        # SLURM_PROCID=0: only an interpreter is a rank.
        if env.get("SLURM_PROCID") != str(rank) or "python" not in Path(argv[0]).name:
            continue
        if RANK_MODULE in argv:
            return int(proc.name)
        if "slurmkit.worker.standby" in argv and "--attempt" in argv:
            attempt = int(argv[argv.index("--attempt") + 1])
            go = StandbyGo(env.get("SLURM_JOB_ID", ""), int(env.get("SLURM_RESTART_COUNT") or 0), attempt)
            if go.given(paths):
                return int(proc.name)
    raise LookupError(f"rank {rank} of {paths.run_id}: no process on this machine")
