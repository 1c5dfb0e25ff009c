"""What every command module shares: the error wrapper and the common options."""

from __future__ import annotations

import functools
import json
import math
import os
import stat
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from slurmkit.errors import ConfigError, SlurmkitError

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
    def wrapper(*args: object, **kwargs: object) -> Any:
        try:
            return fn(*args, **kwargs)
        except SlurmkitError as exc:
            typer.echo(f"error: {exc.one_line()}", err=True)
            for line in exc.details(verbose=bool(kwargs.get("verbose"))):
                typer.echo(f"  {line}", err=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


PSEUDO_FS = ("/proc", "/sys")


def output_file(raw: str | None, option: str) -> Path | None:
    """The file an option names for slurmkit to write (`--csv`, `report -o`), or one line saying why it
    cannot be one: empty, a folder, something there that is not a regular file (a device such as
    /dev/null, a FIFO: slurmkit writes beside and renames over, which would replace it), or under
    /proc or /sys. Missing folders on its way are made when it is written (atomic.write_output)."""
    if raw is None:
        return None
    valid = "valid: a file path, e.g. results.csv"
    if not raw.strip():
        raise ConfigError("an empty path", where=option, valid=valid)
    path = Path(raw).expanduser()
    real = os.path.realpath(path)
    if any(real == p or real.startswith(p + "/") for p in PSEUDO_FS):
        raise ConfigError(f"{raw} is under /{real.split('/')[1]}, not a file to write", where=option, valid=valid)
    if path.is_dir():
        raise ConfigError(f"{raw} is a folder", where=option, valid=valid)
    if os.path.exists(real) and not stat.S_ISREG(os.stat(real).st_mode):
        raise ConfigError(f"{raw} is not a regular file (a device, a FIFO or a socket)", where=option, valid=valid)
    return path


def json_safe(data: object) -> Any:
    """`data` with every NaN and infinity as null: strict JSON parsers refuse Python's bare `NaN` and
    `Infinity`, and a metric that is not a number has no value to give."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [json_safe(v) for v in data]
    return data


def _dumps(data: object) -> str:
    return json.dumps(json_safe(data), indent=2, default=str, allow_nan=False)


def print_json(data: object) -> None:
    """JSON on stdout, strict: NaN and infinities are written null (json_safe)."""
    typer.echo(_dumps(data))


def print_json_list(items: Iterable[Any]) -> None:
    """What print_json(list(items)) prints, written item by item: 100,000 rows are never one string."""
    out = sys.stdout
    first = True
    for item in items:
        out.write("[\n  " if first else ",\n  ")
        out.write(_dumps(item).replace("\n", "\n  "))
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
    from slurmkit.load.loader import load_profile, profile_name
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
