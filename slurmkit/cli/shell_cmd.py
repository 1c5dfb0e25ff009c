"""`slurmkit shell -p P`: an interactive allocation with the profile's setup."""

from __future__ import annotations

from typing import Annotated

import typer

from slurmkit.cli.common import ProfileOpt, SetOpt, user_errors


@user_errors
def shell(profile: ProfileOpt = None,
          nodes: Annotated[int | None, typer.Option("--nodes", min=1, help="Nodes to allocate.")] = None,
          gpus: Annotated[int | None, typer.Option("--gpus", min=0, help="GPUs per node.")] = None,
          time: Annotated[str | None, typer.Option("--time", help="Time limit, as Slurm takes it (1:00:00).")] = None,
          sets: SetOpt = None) -> None:
    """Open an interactive shell on a new allocation (salloc, then srun --pty) with the profile's
    resources, partition, account, modules, venv and variables, as its batch jobs see them. It waits
    in the queue until the allocation starts (Ctrl-C gives up); `exit` ends the allocation."""
    from slurmkit.runs.shell import open_shell

    given = {"resources.nodes": nodes, "resources.gpus_per_node": gpus, "resources.time": time}
    status = open_shell(profile, [f"{k}={v}" for k, v in given.items() if v is not None] + list(sets or []))
    raise typer.Exit(status)
