"""What every command module shares: the error wrapper and the common options."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from slurmkit.errors import SlurmkitError

if TYPE_CHECKING:  # the CLI imports the library where a command needs it, to start fast
    from slurmkit.common.layout import RunPaths
    from slurmkit.runs.lookup import Scope

F = TypeVar("F", bound=Callable[..., Any])

ProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", "-p", help="Profile name or YAML path (default: $SLURMKIT_PROFILE or local)."),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override KEY=VALUE (e.g. resources.nodes=2, profile.partition=gpu); repeatable."),
]
RunArg = Annotated[str, typer.Argument(help="Run id, unique prefix, or run folder.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
VerboseOpt = Annotated[bool, typer.Option(
    "--verbose", "-v", help="On a failure, the rank's whole traceback (slurmkit's frames too) and its last output.")]


def user_errors(fn: F) -> F:
    """Turn a SlurmkitError into one line on stderr and its exit code, never a traceback; under it a
    failed job's own frames (its whole traceback and last output where the command has `--verbose`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SlurmkitError as exc:
            typer.echo(f"error: {exc.one_line()}", err=True)
            for line in exc.details(verbose=bool(kwargs.get("verbose"))):
                typer.echo(f"  {line}", err=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def print_json_list(items: Iterable[Any]) -> None:
    """What print_json(list(items)) prints, written item by item: 100,000 rows are never one string."""
    out = sys.stdout
    first = True
    for item in items:
        out.write("[\n  " if first else ",\n  ")
        out.write(json.dumps(item, indent=2, default=str).replace("\n", "\n  "))
        first = False
    out.write("[]\n" if first else "\n]\n")
    out.flush()


AfterOpt = Annotated[str | None, typer.Option(
    "--after", help="Start once this run, sweep or Slurm job succeeded (sbatch --dependency=afterok).")]
AfterAnyOpt = Annotated[str | None, typer.Option(
    "--after-any", help="Start once this run, sweep or Slurm job ended, however (afterany).")]
AfterNotOkOpt = Annotated[str | None, typer.Option(
    "--after-notok", help="Start only if this run, sweep or Slurm job failed (afternotok).")]


def dependency_for(run_root: str, after: str | None, after_any: str | None,
                   after_notok: str | None) -> str | None:
    """The sbatch --dependency of the --after* option given (at most one); a run or sweep it names
    is looked up under `run_root` (the profile the command already loaded)."""
    given = [(kind, ident) for kind, ident in (("afterok", after), ("afterany", after_any),
                                                ("afternotok", after_notok)) if ident]
    if len(given) > 1:
        raise SlurmkitError("more than one of --after, --after-any, --after-notok", where="--after",
                            valid="valid: one of them")
    if not given:
        return None
    from slurmkit.runs.dependency import after_dependency

    kind, ident = given[0]
    return after_dependency(run_root, ident, kind)


def run_root_for(profile: str | None) -> str:
    """The run root of the given (or default) profile, where run ids are looked up."""
    return scope_of(profile).run_root


def scope_of(profile: str | None) -> Scope:
    """The runs the given (or default) profile sees (slurmkit.runs.lookup.Scope)."""
    from slurmkit.config.loader import load_profile, profile_name
    from slurmkit.runs.lookup import Scope

    model = load_profile(profile_name(profile))
    return Scope(model.run_root, model.executor)


def run_of(profile: str | None, ident: str) -> RunPaths:
    """The run `ident` names, as the profile sees it (a run id, prefix, folder or job id)."""
    from slurmkit.runs.lookup import find_in

    return find_in(scope_of(profile), ident)


PIPE_WIDTH = 10_000


def table_console() -> Any:
    """Where tables go: a terminal's own width, or, into a pipe or a file, as wide as the cells need
    (rich takes a pipe for an 80-column terminal and cuts cells to "a…")."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def transitions(describe: Callable[[Any], str]) -> Callable[[Any], None]:
    """For a --wait: each change of state as one timestamped line on stderr (rich styling only
    when stderr is a terminal), so stdout keeps only the result."""
    from rich.console import Console

    from slurmkit.runs.polling import on_change

    console = Console(stderr=True, highlight=False)

    def emit(text: str) -> None:
        import datetime as dt

        console.print(f"[dim]{dt.datetime.now():%H:%M:%S}[/dim] {text}", markup=True, soft_wrap=True)

    return on_change(describe, emit)
