"""`slurmkit track RUN`: send a run's offline W&B runs from the login node."""

from __future__ import annotations

from typing import Annotated

import typer

from slurmkit.cli.common import JsonOpt, ProfileOpt, RunArg, print_json, run_of, user_errors


@user_errors
def track(run: RunArg, profile: ProfileOpt = None,
          dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would be sent; send nothing.")] = False,
          as_json: JsonOpt = False) -> None:
    """Send an ended run's goodput accounting to its trackers, and its offline Weights & Biases runs
    (tracking.wandb: offline) to W&B, as one run."""
    from dataclasses import asdict

    from slurmkit.runs.tracker_upload import track as send

    synced = send(run_of(profile, run), dry_run)
    if as_json:
        print_json(asdict(synced))
    else:
        if synced.accounting is not None:
            typer.echo(f"goodput accounting sent to the trackers: {len(synced.accounting)} numbers")
        typer.echo(synced.output)
    if synced.returncode:
        raise typer.Exit(synced.returncode)
