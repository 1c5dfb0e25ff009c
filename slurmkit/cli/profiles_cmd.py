"""`slurmkit profiles list | show | validate | schema`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from slurmkit.cli.common import JsonOpt, print_json, table_console, user_errors

app = typer.Typer(no_args_is_help=True, help="Cluster profiles: list, show, validate, schema.")


@app.command("list")
@user_errors
def list_(as_json: JsonOpt = False) -> None:
    """List the profiles on the search path ($SLURMKIT_PROFILE_PATH, then the shipped ones)."""
    from slurmkit.load.loader import available_profiles, describe
    rows = [{"name": n, "path": str(p), "description": describe(p)} for n, p in sorted(available_profiles().items())]
    if as_json:
        print_json(rows)
        return
    from rich.table import Table

    table = Table("name", "description", "path")
    for row in rows:
        table.add_row(row["name"], row["description"], row["path"])
    table_console().print(table)


@app.command()
@user_errors
def show(name: Annotated[str, typer.Argument(help="Profile name or path.")]) -> None:
    """Print a profile with its `extends` chain resolved and every default filled in."""
    from slurmkit.load import yamlio
    from slurmkit.load.loader import load_profile
    typer.echo(yamlio.dump(load_profile(name).model_dump()), nl=False)


@app.command()
@user_errors
def validate(file: Annotated[Path, typer.Argument(help="Profile YAML to check.")]) -> None:
    """Validate a profile file; exit 2 with one line saying what is wrong."""
    from slurmkit.load.loader import load_profile
    load_profile(str(file) if file.suffix else f"./{file}")
    typer.echo(f"ok: {file}")


@app.command()
def schema() -> None:
    """Print the JSON Schema of a profile (for editor completion)."""
    from slurmkit.config.profile import ClusterProfile

    print_json(ClusterProfile.model_json_schema())
