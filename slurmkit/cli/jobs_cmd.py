"""`slurmkit submit | resubmit | status | logs | cancel | result | list`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from slurmkit.cli.common import (
    AfterAnyOpt,
    AfterNotOkOpt,
    AfterOpt,
    JsonOpt,
    ProfileOpt,
    RunArg,
    SetOpt,
    VerboseOpt,
    dependency_for,
    print_json,
    run_of,
    scope_of,
    table_console,
    transitions,
    user_errors,
)

if TYPE_CHECKING:
    from slurmkit.common.layout import RunPaths
    from slurmkit.runs.jobs import Submitted


@user_errors
def submit(
    runspec: Annotated[Path, typer.Argument(help="Run spec YAML.")],
    profile: ProfileOpt = None,
    set_: SetOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the script; submit nothing.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the run to end and print its result.")] = False,
    after: AfterOpt = None,
    after_any: AfterAnyOpt = None,
    after_notok: AfterNotOkOpt = None,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Submit RUNSPEC; print its run id and job id."""
    from slurmkit.load.loader import resolve
    from slurmkit.runs import jobs

    resolved = resolve(runspec, profile, set_ or [])
    dependency = dependency_for(resolved.profile.run_root, after, after_any, after_notok)
    if dry_run:
        typer.echo(jobs.dry_run(resolved, dependency).script, nl=False)
        return
    _announce(jobs.submit(resolved, dependency), wait, as_json)


def _announce(sub: Submitted, wait: bool, as_json: bool) -> None:
    """Print a submitted run; with wait, follow it to its end and print its result."""
    from slurmkit.common.layout import RunPaths

    if as_json and not wait:
        print_json({"run_id": sub.run_id, "job_id": sub.job_id, "run_dir": sub.run_dir})
    elif not as_json:
        typer.echo(f"run {sub.run_id}  job {sub.job_id}  {sub.run_dir}")
    if wait:
        _wait_and_print(RunPaths(Path(sub.run_dir)), as_json)


def _wait_and_print(paths: RunPaths, as_json: bool) -> None:
    """Follow a run to its end; print its state and result (a failure: one line, its exit code)."""
    from slurmkit.runs import jobs

    final = jobs.wait(paths, on_answer=transitions(jobs.describe))
    value = jobs.result(paths)
    if as_json:
        print_json({"run_id": paths.run_dir.name, "job_id": final.job_id, "run_dir": str(paths.run_dir),
                    "state": final.state, "result": value})
    else:
        typer.echo(f"{final.state}")
        _print_value(value)


@user_errors
def wait(run: RunArg, profile: ProfileOpt = None, as_json: JsonOpt = False, verbose: VerboseOpt = False) -> None:
    """Wait for a run to end (it may be pending, running or requeued); print its state and result."""
    _wait_and_print(run_of(profile, run), as_json)


@user_errors
def resubmit(
    run: RunArg,
    profile: ProfileOpt = None,
    partition: Annotated[str | None, typer.Option("--partition", help="Run the new job here instead.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the run to end and print its result.")] = False,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Submit an ended run again under its run id; it resumes from its newest checkpoint."""
    from slurmkit.runs import jobs

    _announce(jobs.resubmit(run_of(profile, run), partition), wait, as_json)


@user_errors
def status(
    runs: Annotated[list[str] | None, typer.Argument(help="Runs to show (default: all).")] = None,
    profile: ProfileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the state of runs: one squeue call for all, sacct only for finished jobs."""
    from slurmkit.runs import jobs

    rows = jobs.status(scope_of(profile), runs)
    if as_json:
        print_json([r.as_dict() for r in rows])
        return
    from rich.table import Column, Table

    table = Table("job", "state", "nodes", "elapsed", "restarts", "goodput", "node-h (lost)", "jobs")
    # The run id is what a user types next: never cut, whatever the terminal's width.
    table.columns.insert(0, Column("run", no_wrap=True, min_width=max((len(r.run_id) for r in rows), default=3)))
    for row in rows:
        gp = f"{row.goodput:.0%}" if row.goodput is not None else ""
        state = f"{row.state} ({row.reason})" if row.reason else row.state
        if row.stragglers:
            named = (f"rank {s['rank']} on {s['node']} {s['score']:.2f}" for s in row.stragglers)
            state += f" stragglers: {', '.join(named)}"
        if row.parts:  # a heterogeneous run: each part's state and ranks
            state += "".join(f"\n {p['name']}: {p['state']}, {p['ranks']} rank(s)"
                             + (f", {p['in_job_restarts']} in-job restart(s)" if p["in_job_restarts"] else "")
                             for p in row.parts)
        spent = f"{row.node_hours:.2f} ({row.lost_node_hours or 0:.2f})" if row.node_hours is not None else ""
        table.add_row(row.run_id, row.job_label, state, row.nodes, row.elapsed, str(row.restarts), gp, spent,
                      str(row.jobs))
    console = table_console()
    console.print(table)
    for r in rows:
        if r.cause:
            console.print(f"{r.run_id}: {r.cause}", markup=False, highlight=False)


@user_errors
def list_runs(profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """List runs, newest first."""
    from slurmkit.runs import jobs

    rows = jobs.status(scope_of(profile))
    if as_json:
        print_json([{"run_id": r.run_id, "run_dir": r.run_dir, "state": r.state, "job_id": r.job_id,
                     "executor": r.executor, "created": r.created, "name": r.name} for r in rows])
        return
    typer.echo("run_id\tstate\tjob_id\trun_dir")
    for r in rows:
        typer.echo(f"{r.run_id}\t{r.state}\t{r.job_label}\t{r.run_dir}")


@user_errors
def logs(
    run: RunArg,
    profile: ProfileOpt = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep following, across requeues, until the run ends.")
    ] = False,
    rank: Annotated[int | None, typer.Option("--rank", help="Only this rank's output.")] = None,
    component: Annotated[str | None, typer.Option(
        "--component", help="A heterogeneous run's part: its ranks' output (default: the run's primary part).")] = None,
) -> None:
    """Print every rank's output, each line prefixed with its rank ([N!] marks stderr)."""
    from slurmkit.runs import logs as run_logs

    for line in run_logs.logs(run_of(profile, run), rank=rank, follow=follow, component=component):
        typer.echo(line)


@user_errors
def cancel(run: RunArg, profile: ProfileOpt = None) -> None:
    """Cancel every job of a run."""
    from slurmkit.runs import jobs

    ids = jobs.cancel(run_of(profile, run))
    typer.echo(f"cancelled {', '.join(ids) or 'nothing'}")


@user_errors
def result(run: RunArg, profile: ProfileOpt = None, as_json: JsonOpt = False, verbose: VerboseOpt = False) -> None:
    """Print the run's return value; on failure, the tail of the failing rank's log (exit 4)."""
    from slurmkit.runs import jobs

    value = jobs.result(run_of(profile, run))
    if as_json:
        print_json(value)
    else:
        _print_value(value)


def _print_value(value: object) -> None:
    if isinstance(value, dict):
        for line in human_lines(value):
            typer.echo(f"  {line}")
    else:
        typer.echo(repr(value))


PERCENT_KEYS = ("accuracy", "mfu")


def human(key: str, item: object) -> str:
    """A result's number as a person reads it: 96.7 %, 24,006/s, 2.67 ms, 0.03936; `--json` keeps them exact."""
    if isinstance(item, bool) or not isinstance(item, (int, float)):
        return str(item)
    if key in PERCENT_KEYS:
        return f"{item:.1%}".replace("%", " %")
    if key.endswith("_per_s"):
        return f"{item:,.0f}/s"
    if key.endswith("_s") and isinstance(item, float):
        return f"{item * 1000:.3g} ms" if abs(item) < 1 else f"{item:,.3g} s"
    if key.endswith("flops"):
        return f"{item:.3g} FLOP/s"
    return f"{item:,}" if isinstance(item, int) else f"{item:.4g}"


def human_lines(value: Mapping[str, object]) -> list[str]:
    """One line a field that applies: none for an unset one (`resumed_from_step: None`) or a rate the
    run does not have (`tokens_per_s` of a classifier, 0); `--json` keeps every field."""
    return [f"{key}: {human(key, item)}" for key, item in value.items()
            if item is not None and not (key.endswith("_per_s") and item == 0)]
