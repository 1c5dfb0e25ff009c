"""`slurmkit render`: print the sbatch script exactly as it would be submitted."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from slurmkit.cli.common import ProfileOpt, SetOpt, user_errors


@user_errors
def render(
    runspec: Annotated[Path, typer.Argument(help="Run spec YAML.")],
    profile: ProfileOpt = None,
    set_: SetOpt = None,
) -> None:
    """Print the sbatch script for RUNSPEC, exactly as `submit` would submit it."""
    from slurmkit.load.loader import resolve
    from slurmkit.runs.jobs import dry_run

    typer.echo(dry_run(resolve(runspec, profile, set_ or [])).script, nl=False)
