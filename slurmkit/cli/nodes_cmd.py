"""`slurmkit nodes -p PROFILE`: the nodes your runs blamed on that cluster; `--forget NODE` clears one."""

from __future__ import annotations

from typing import Annotated

import typer

from slurmkit.cli.common import JsonOpt, ProfileOpt, print_json, user_errors


@user_errors
def nodes(profile: ProfileOpt = None,
          forget: Annotated[str | None, typer.Option("--forget", help="Clear every blame of this node.")] = None,
          as_json: JsonOpt = False) -> None:
    """List the nodes your runs blamed on this cluster (failed health gate, lost, hung rank) within the
    profile's node_ledger.window, and which the next submit keeps off."""
    from slurmkit.load.loader import load_profile, profile_name
    from slurmkit.runs import nodes as ledger

    prof = load_profile(profile_name(profile))
    if forget is not None:
        cleared = ledger.forget(forget)
        if as_json:
            print_json({"node": forget, "forgotten": cleared})
        else:
            typer.echo(f"{forget}: {cleared} blame(s) forgotten")
        return
    found = ledger.blamed(prof)
    if as_json:
        print_json([n.as_dict() for n in found])
        return
    if not found:
        typer.echo(f"no node blamed within {prof.node_ledger.window}")
        return
    for n in found:
        mark = "  excluded at the next submit" if n.excluded else ""
        typer.echo(f"{n.node}  {n.blames} blame(s): {n.causes}  last {n.last}  runs {', '.join(n.runs) or '-'}{mark}")
