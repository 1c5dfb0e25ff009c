"""`slurmkit doctor`."""

from __future__ import annotations

import typer

from slurmkit.cli.common import JsonOpt, ProfileOpt, print_json, user_errors

DOCTOR_SPEC = {"name": "slurmkit-doctor", "command": "true"}


@user_errors
def doctor(profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """Check that the profile works from here: Slurm, munge, compute-node Python, storage, NCCL, containers."""
    from slurmkit.insight import doctor as doc
    from slurmkit.load.loader import resolve

    checks = doc.run(resolve(DOCTOR_SPEC, profile))
    if as_json:
        print_json([c.as_dict() for c in checks])
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            typer.echo(f"{c.status:<4}  {c.name:<{width}}  {c.detail}")
            if c.fix and c.status in (doc.FAIL, doc.WARN):
                typer.echo(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
    if doc.failed(checks):
        raise typer.Exit(1)
