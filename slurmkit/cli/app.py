"""The root Typer app. Importing this module must not import torch (tests check sys.modules)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
import typer.core

from slurmkit import __version__
from slurmkit.cli import (
    attach_cmd,
    bench_cmd,
    devcluster_cmd,
    doctor_cmd,
    env_cmd,
    jobs_cmd,
    nodes_cmd,
    profiles_cmd,
    remote_cmd,
    render_cmd,
    report_cmd,
    shell_cmd,
    stack_cmd,
    sweep_cmd,
    track_cmd,
)
from slurmkit.cli.common import user_errors

_shown_type = getattr(typer.core.TyperOption, "display_type_rich", None)


def _flags_read_as_flags(self: typer.core.TyperOption, ctx: Any) -> str | None:
    """typer 0.29 shows every flag as `--wait <bool>`, which reads as if it took a value (and
    `--wait true` is refused): a flag shows no type."""
    return None if self.is_flag or _shown_type is None else _shown_type(self, ctx)


if _shown_type is not None:  # older typer (>= 0.12, as pyproject allows) has no such hook and shows no type
    typer.core.TyperOption.display_type_rich = _flags_read_as_flags  # type: ignore[method-assign]


class ForwardingGroup(typer.core.TyperGroup):
    """The root group: a command whose profile names a login host runs there (slurmkit.remote),
    before this side parses it; its exit status is this one's."""

    def invoke(self, ctx: Any) -> Any:
        code = _forwarded([*ctx._protected_args, *ctx.args])  # click keeps the command line here
        if code is not None:
            raise typer.Exit(code)
        return super().invoke(ctx)


@user_errors
def _forwarded(argv: list[str]) -> int | None:
    from slurmkit.remote.forward import forward

    return forward(argv)


app = typer.Typer(
    name="slurmkit",
    cls=ForwardingGroup,
    no_args_is_help=True,
    help="Slurm-native job orchestration: multi-node PyTorch jobs, requeue on preemption, sweeps.",
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"slurmkit {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """slurmkit: submit, watch and sweep Slurm jobs."""


app.command("render")(render_cmd.render)
app.command("submit")(jobs_cmd.submit)
app.command("resubmit")(jobs_cmd.resubmit)
app.command("status")(jobs_cmd.status)
app.command("list")(jobs_cmd.list_runs)
app.command("logs")(jobs_cmd.logs)
app.command("cancel")(jobs_cmd.cancel)
app.command("result")(jobs_cmd.result)
app.command("wait")(jobs_cmd.wait)
app.command("connect")(remote_cmd.connect)
app.command("disconnect")(remote_cmd.disconnect)
app.command("stack")(stack_cmd.stack)
app.command("attach")(attach_cmd.attach)
app.command("shell")(shell_cmd.shell)
app.command("doctor")(doctor_cmd.doctor)
app.command("report")(report_cmd.report)
app.command("track")(track_cmd.track)
app.command("nodes")(nodes_cmd.nodes)
app.add_typer(sweep_cmd.app, name="sweep")
app.add_typer(profiles_cmd.app, name="profiles")
app.add_typer(devcluster_cmd.app, name="devcluster")
app.add_typer(bench_cmd.app, name="bench")
app.add_typer(env_cmd.app, name="env")


def main() -> None:
    app()
