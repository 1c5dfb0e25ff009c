"""`slurmkit connect` / `disconnect`: open or close the one SSH connection to a profile's login host."""

from __future__ import annotations

from typing import Annotated

import typer

from slurmkit.cli.common import ProfileOpt, print_json, user_errors
from slurmkit.errors import ConfigError


def _site(profile: str | None):  # type: ignore[no-untyped-def]
    from slurmkit.load.loader import profile_name
    from slurmkit.remote.forward import site_of

    site = site_of(profile)
    if site is None:
        raise ConfigError("this profile names no login host", where=f"{profile_name(profile)}:login",
                          valid="valid: a profile with login: {host: ...} (docs/remote.md)")
    return site


@user_errors
def connect(profile: ProfileOpt = None,
            as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Open the connection to the profile's login host (it may ask for a password or a code once);
    every later command of the profile goes through it until it has been idle for login.control_persist."""
    from slurmkit.remote.session import connect as open_session

    hello = open_session(_site(profile))
    if as_json:
        print_json(hello.as_dict())
        return
    typer.echo(f"connected to {hello.destination}: slurmkit {hello.slurmkit}, Python {hello.python}")
    if hello.python_note:
        typer.echo(f"note: {hello.python_note}", err=True)


@user_errors
def disconnect(profile: ProfileOpt = None) -> None:
    """Close the connection to the profile's login host."""
    site = _site(profile)
    closed = site.connection.close()
    typer.echo(f"{'closed' if closed else 'no connection to'} {site.login.destination}")
