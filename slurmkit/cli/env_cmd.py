"""`slurmkit env pack -p PROFILE`: pack the ranks' environment for the profile's stage.env ahead of a submit."""

from __future__ import annotations

import typer

from slurmkit.cli.common import JsonOpt, ProfileOpt, print_json, user_errors

app = typer.Typer(no_args_is_help=True, help="The ranks' Python environment, staged to the nodes (docs/staging.md).")


@app.command()
@user_errors
def pack(profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """Pack this environment where the profile's submits find it (0 s when nothing changed)."""
    from slurmkit.common.layout import expand_root
    from slurmkit.load.loader import load_profile, profile_name
    from slurmkit.stage import envpack, staging

    prof = load_profile(profile_name(profile))
    packed = staging.pack_said(envpack.identify(expand_root(prof.run_root), prof.python))
    if as_json:
        print_json({"hash": packed.image.digest, "image": str(packed.image.image), "bytes": packed.bytes,
                    "seconds": round(packed.seconds, 3), "reused": packed.reused,
                    "distributions": len(packed.image.distributions)})
    else:
        typer.echo(str(packed.image.image))
