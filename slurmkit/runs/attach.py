"""`slurmkit attach RUN [--rank N]`: an interactive shell inside a live run's allocation, on the node
where rank N runs, beside the job's own steps (`srun --overlap --pty`): the run's files, its
processes, its node's GPUs as the ranks see them; a run in a container gets the shell in its ranks'
image with their mounts and variables. The shell starts in the run folder with SLURMKIT_RUN_DIR,
SLURMKIT_RANK and SLURM_JOB_ID set.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmkit.common.atomic import atomic_write_text
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import RankProcess
from slurmkit.common.record import RunFile, RunRecord
from slurmkit.config.resolved import Resolved
from slurmkit.errors import SlurmkitError
from slurmkit.render import render_interactive
from slurmkit.runs.jobs import statuses
from slurmkit.runs.shell import LAUNCHER


@dataclass(frozen=True)
class Target:
    """Where `attach` goes: the run's current job, on the node rank `rank` runs on."""

    run_dir: str
    job_id: str
    rank: int
    host: str
    launcher: str | None = None
    """A run in a container: the launcher that opens the shell in it (render.render_interactive)."""


def target(paths: RunPaths, rank: int = 0) -> Target:
    """The live job and node of `rank`; a run that is not running, a rank it does not have or one
    that has not started yet is one line."""
    record = RunFile(paths).read()
    state = statuses([(paths, record)])[0].state
    if record.executor != "slurm" or not record.job_ids or state != "RUNNING":
        raise SlurmkitError(f"run {paths.run_id} is not running on Slurm (state {state})",
                            valid="attach goes into a RUNNING Slurm run: `slurmkit status` lists them")
    if not 0 <= rank < record.num_tasks:
        raise SlurmkitError(f"run {paths.run_id} has no rank {rank}", where="--rank",
                            valid=f"its ranks are 0-{record.num_tasks - 1}")
    job_id = record.job_ids[-1]
    where = RankProcess.read(paths, job_id, rank)
    if where is None:
        raise SlurmkitError(f"rank {rank} of run {paths.run_id} has not started yet (no record of its node)",
                            valid="attach once the run steps (`slurmkit logs -f` shows it)")
    return Target(str(paths.run_dir), job_id, rank, where.host, _launcher(paths, record))


def _launcher(paths: RunPaths, record: RunRecord) -> str | None:
    """A run in a container: the launcher into the same image, mounts and variables as its ranks
    (written into the run folder, which the container mounts); None for a run on the host."""
    if record.profile.container is None or record.spec is None:
        return None
    resolved = Resolved(record.spec, record.profile, record.profile_name, record.resources, record.spec_source)
    launcher = paths.run_dir / LAUNCHER
    atomic_write_text(launcher, render_interactive(resolved, str(paths.run_dir)))
    return str(launcher)
