"""`slurmkit track RUN`: send a run's offline W&B runs from the login node."""

from __future__ import annotations

from typing import Annotated

import typer

from slurmkit.cli.common import JsonOpt, ProfileOpt, RunArg, print_json, run_root_for, user_errors


@user_errors
def track(run: RunArg, profile: ProfileOpt = None,
          dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would be sent; send nothing.")] = False,
          as_json: JsonOpt = False) -> None:
    """Sync the run's offline Weights & Biases runs (tracking.wandb: offline) to W&B, as one run."""
    from dataclasses import asdict

    from slurmkit.runs.lookup import find as find_run
    from slurmkit.runs.track import sync

    synced = sync(find_run(run_root_for(profile), run), dry_run)
    if as_json:
        print_json(asdict(synced))
    else:
        typer.echo(synced.output)
    if synced.returncode:
        raise typer.Exit(synced.returncode)
