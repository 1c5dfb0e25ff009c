"""`slurmkit stack RUN`: every rank's Python stack now, merged by rank."""

from __future__ import annotations

from typing import Annotated

import typer

from slurmkit.cli.common import JsonOpt, ProfileOpt, RunArg, print_json, run_of, user_errors


@user_errors
def stack(run: RunArg, profile: ProfileOpt = None,
          wait_s: Annotated[float, typer.Option("--wait", min=0.5, help="Seconds to wait for the answers.")] = 10.0,
          as_json: JsonOpt = False) -> None:
    """Print every rank's Python stack now, without stopping the run (a rank that does not answer:
    its process state, e.g. stopped)."""
    from slurmkit.runs.stack import stacks

    found = stacks(run_of(profile, run), wait_s)
    if as_json:
        print_json([s.as_dict() for s in found])
        return
    for s in found:
        where = f" on {s.host} (pid {s.pid})" if s.host else ""
        typer.echo(f"== rank {s.rank}{where}: " + ("" if s.answered else f"no answer; {s.state}"))
        if s.answered:
            typer.echo(s.stack)
