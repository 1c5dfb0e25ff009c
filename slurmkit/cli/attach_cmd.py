"""`slurmkit attach RUN [--rank N]`: a shell inside a live run, on the node of one of its ranks."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from slurmkit.cli.common import ProfileOpt, RunArg, run_of, user_errors


@user_errors
def attach(run: RunArg, profile: ProfileOpt = None,
           rank: Annotated[int, typer.Option("--rank", min=0, help="The rank whose node to go to.")] = 0) -> None:
    """Open a shell inside a running job, on the node where a rank runs (srun --overlap --pty), in
    the run folder: its files and processes as the ranks see them. Leave it with `exit`."""
    from slurmkit.runs.attach import target
    from slurmkit.slurm import interactive

    to = target(run_of(profile, run), rank)
    typer.echo(f"slurmkit: attaching to job {to.job_id} on {to.host} (rank {to.rank}); `exit` leaves", err=True)
    env = {**os.environ, "SLURMKIT_RUN_DIR": to.run_dir, "SLURMKIT_RANK": str(to.rank)}
    interactive.exec_interactive(interactive.attach_argv(to.job_id, to.host, to.run_dir, launcher=to.launcher), env)
