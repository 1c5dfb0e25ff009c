"""`slurmkit sweep SPEC | status | results | resubmit | resume | list | cancel`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from slurmkit.cli.common import (
    AfterAnyOpt,
    AfterNotOkOpt,
    AfterOpt,
    JsonOpt,
    ProfileOpt,
    SetOpt,
    dependency_for,
    output_file,
    print_json,
    print_json_list,
    run_root_for,
    transitions,
    user_errors,
)
from slurmkit.jsontypes import JsonObject


class _SubmitByDefault(TyperGroup):
    """`slurmkit sweep SPEC ...` means `slurmkit sweep submit SPEC ...`."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["submit", *args]
        return super().parse_args(ctx, args)


if TYPE_CHECKING:
    from slurmkit.sweeps.submit import SweepSubmitted

app = typer.Typer(cls=_SubmitByDefault, no_args_is_help=True,
                  help="Config sweeps as Slurm job arrays: `slurmkit sweep SPEC` submits one.")

# The results table keeps to these (and the --sort metric); --json and --csv carry every metric.
TABLE_METRICS = ("loss", "accuracy", "mfu", "samples_per_s", "restarts", "returncode")
SHOWN_TASKS = 20  # a submit lists the first tasks; --dry-run and `sweep status` list them all
SweepArg = Annotated[str, typer.Argument(help="Sweep id, unique prefix, or sweep folder.")]


@app.command("submit")
@user_errors
def submit(
    spec: Annotated[Path, typer.Argument(help="Sweep spec YAML: a run spec plus a `sweep:` section.")],
    profile: ProfileOpt = None,
    grid: Annotated[list[str] | None, typer.Option("--grid", help="KEY=V1,V2,... adds or replaces a grid key.")] = None,
    set_: SetOpt = None,
    max_parallel: Annotated[int | None, typer.Option("--max-parallel", min=1,
                                                     help="Tasks running at once (--array=...%N).")] = None,
    max_array_size: Annotated[int | None, typer.Option(
        "--max-array-size", min=1, help="Arrays of at most N tasks (default and cap: MaxArraySize).")] = None,
    after: AfterOpt = None,
    after_any: AfterAnyOpt = None,
    after_notok: AfterNotOkOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the tasks and arrays; submit nothing.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until no task is active; print the counts.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit a sweep: one job array per chunk of at most MaxArraySize tasks."""
    from slurmkit.load.loader import load_profile, profile_name
    from slurmkit.load.overrides import split_sets
    from slurmkit.sweeps import plan as plan_mod
    from slurmkit.sweeps import resolve as resolve_mod
    from slurmkit.sweeps import spec as spec_mod
    from slurmkit.sweeps import submit as sub

    prof = load_profile(profile_name(profile), split_sets(set_ or [])[1])  # the one load, --set included
    plan = spec_mod.load(spec, grid, max_parallel, max_tasks=prof.sweep_max_tasks)
    if dry_run and plan.section.search is not None:
        _search_preview(plan, profile, set_, prof, as_json)
        return
    if dry_run:
        resolved = resolve_mod.resolve_tasks(plan, profile, set_, loaded=prof)
        _print_preview(plan_mod.preview(plan, resolved, max_array_size), plan.varying, as_json)
        return
    dependency = dependency_for(prof.run_root, after, after_any, after_notok)
    done = sub.submit(plan, profile, set_, max_array_size, dependency, loaded=prof)
    if plan.section.search is not None:
        _search_submitted(done, plan.section.search.batch, wait, as_json)
        return
    if wait:
        _wait_and_print(done, as_json)
        return
    _print_submitted(done, plan.overrides, plan.varying, as_json)


def _print_submitted(done: SweepSubmitted, overrides: list[JsonObject], varying: list[str], as_json: bool) -> None:
    """What a submitted sweep is: its id, arrays and folder, and its first tasks' values."""
    if as_json:
        print_json(done.as_dict())
        return
    arrays = ", ".join(done.array_job_ids) or "local runner"
    typer.echo(f"sweep {done.sweep_id}  {done.tasks} tasks  arrays {arrays}  {done.sweep_dir}")
    tasks = [{"index": i, **o} for i, o in enumerate(overrides[:SHOWN_TASKS])]
    _table(["index", *varying], tasks)
    if done.tasks > SHOWN_TASKS:
        typer.echo(f"... and {done.tasks - SHOWN_TASKS} more: `slurmkit sweep status {done.sweep_id}`")


def _wait_and_print(done: SweepSubmitted, as_json: bool) -> None:
    """--wait: follow the sweep until no task is active; its counts."""
    from slurmkit.common import sweep_layout
    from slurmkit.sweeps import results

    states = results.wait(sweep_layout.SweepPaths(Path(done.sweep_dir)), on_answer=transitions(results.describe))
    if as_json:
        print_json({**done.as_dict(), "counts": results.counts(states)})
    else:
        typer.echo(f"sweep {done.sweep_id}: " + "  ".join(f"{k} {v}" for k, v in results.counts(states).items()))
    if not any(s.state == "COMPLETED" for s in states):  # every task failed, was cancelled or never ran
        raise typer.Exit(1)


def _search_preview(plan: Any, profile: str | None, sets: list[str] | None, prof: Any, as_json: bool) -> None:
    """--dry-run of a search: its trials and arrays; one trial at its params' low ends validated."""
    from slurmkit.sweeps import search as search_mod
    from slurmkit.sweeps.resolve import search_base

    search_base(plan, profile, sets, prof)  # a value a trial could get that the spec refuses: one line now
    info = search_mod.preview(plan)
    if as_json:
        print_json(info)
        return
    s = plan.section.search
    typer.echo(f"search of {info['tasks']} trials in {info['arrays']} array(s) of {s.batch}, sampler {s.sampler}, "
               f"{s.mode} {s.metric}")


def _search_submitted(done: SweepSubmitted, batch: int, wait: bool, as_json: bool) -> None:
    """A search: its first array and driver; with --wait, the best so far each time trials end."""
    from slurmkit.common import sweep_layout
    from slurmkit.sweeps import search_view

    paths = sweep_layout.SweepPaths(Path(done.sweep_dir))
    if not wait:
        if as_json:
            print_json(done.as_dict())
        else:
            typer.echo(f"sweep {done.sweep_id}  search of {done.tasks} trials, {batch} a batch  first array "
                       f"{', '.join(done.array_job_ids) or 'local runner'}  {done.sweep_dir}\n"
                       f"its driver runs detached: `slurmkit sweep status {done.sweep_id}`")
        return
    state = search_view.follow(paths, None if as_json else lambda st: typer.echo(st.line()))
    if as_json:
        print_json({**done.as_dict(), "search": state.as_dict()})
    if state.driver != "done" or state.best is None:  # the driver failed, or no trial gave the metric
        raise typer.Exit(1)


def _print_preview(info: JsonObject, varying: list[str], as_json: bool) -> None:
    """What a sweep would submit (--dry-run)."""
    if as_json:
        print_json(info)
        return
    typer.echo(f"{info['tasks']} tasks in {len(info['arrays'])} array(s) "
               f"(MaxArraySize {info['max_array_size']} assumed; submit reads the cluster's):")
    for k, arr in enumerate(info["arrays"]):
        typer.echo(f"  array {k}: tasks {arr['tasks']} as --array={arr['array']}")
    _table(["index", *varying, "seed"], info["configs"])


@app.command("status")
@user_errors
def status(sweep: SweepArg, profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """Counts by state and a per-task table (one squeue call, at most one sacct); a search's driver and best."""
    from slurmkit.runs import folders
    from slurmkit.sweeps import results, search_view

    paths = folders.find_sweep(run_root_for(profile), sweep)
    states = results.task_states(paths)
    search = search_view.search_state(paths) if paths.driver.exists() else None
    if as_json:
        print_json({"sweep_id": paths.sweep_id, "counts": results.counts(states), "cost": results.total_cost(states),
                    "tasks": [s.as_dict() for s in states], **({"search": search.as_dict()} if search else {})})
        return
    if search is not None:
        typer.echo(f"search: {search.line()}")
    spent = results.total_cost(states)
    typer.echo(f"sweep {paths.sweep_id}: " + "  ".join(f"{k} {v}" for k, v in results.counts(states).items())
               + (f"  ({spent['node_hours']:.3f} node-hours, {spent['gpu_hours']:.3f} GPU-hours so far)"
                  if spent["node_hours"] else ""))
    _table(["index", "job", "state", "nodes", "elapsed", "restarts"],
           [{"index": s.index, "job": s.job_id, "state": s.state, "nodes": s.nodes, "elapsed": s.elapsed,
             "restarts": s.restarts} for s in states])


@app.command("results")
@user_errors
def results(
    sweep: SweepArg,
    profile: ProfileOpt = None,
    csv_file: Annotated[str | None, typer.Option("--csv", help="Also write the table to this CSV file.")] = None,
    sort: Annotated[str | None, typer.Option("--sort", help="Order by this metric, best first.")] = None,
    maximize: Annotated[bool | None, typer.Option(
        "--max/--min", help="Whether larger is better (default: smaller for loss/error/time, else larger).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """One row per task: its varying config, final metrics and state; the best row is marked."""
    from slurmkit.runs import folders
    from slurmkit.sweeps import results

    paths = folders.find_sweep(run_root_for(profile), sweep)
    if as_json and sort is None and csv_file is None:
        print_json_list(results.iter_rows(paths))  # streamed: no table to build
        return
    table = results.results(paths, sort, maximize)
    if (csv_path := output_file(csv_file, "--csv")) is not None:
        results.write_csv(table, str(csv_path))
    if as_json:
        print_json_list(table.rows)
        return
    shown = [m for m in table.metrics if m in TABLE_METRICS or m == table.sort]
    _table(["index", "state", *table.varying, *shown], table.rows, best=table.best)
    if len(shown) < len(table.metrics):
        typer.echo(f"({len(table.metrics) - len(shown)} more metrics in --json and --csv)")
    if table.best is not None:
        typer.echo(f"best: task {table.best} by {table.sort}")


@app.command("resubmit")
@user_errors
def resubmit(
    sweep: SweepArg,
    failed: Annotated[bool, typer.Option("--failed", help="Failed, cancelled, timed-out, unsubmitted tasks.")] = False,
    profile: ProfileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run again, in one new array under the same sweep, only the tasks that did not succeed."""
    from slurmkit.errors import SlurmkitError
    from slurmkit.runs import folders
    from slurmkit.sweeps import results
    from slurmkit.sweeps import submit as sub
    from slurmkit.sweeps.plan import compress

    if not failed:
        raise SlurmkitError("say which tasks to resubmit", where="resubmit", valid="valid: --failed")
    paths = folders.find_sweep(run_root_for(profile), sweep)
    states = {s.index: s.state for s in results.task_states(paths)}
    indices = sub.resubmit_failed(paths, states)
    if as_json:
        print_json({"sweep_id": paths.sweep_id, "resubmitted": indices})
    else:
        typer.echo(f"resubmitted {len(indices)} task(s): {compress(indices) if indices else 'none'}")


@app.command("list")
@user_errors
def list_sweeps(profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """Sweeps under the run root, newest first."""
    from slurmkit.common import sweep_layout
    from slurmkit.runs import folders
    from slurmkit.runs.lookup import readable

    rows = []
    for _, m in readable(folders.list_sweeps(run_root_for(profile)), lambda p: sweep_layout.Manifest(p).read()):
        rows.append({"sweep_id": m.sweep_id, "tasks": len(m.tasks), "created": m.created,
                     "arrays": ",".join(a.job_id for a in m.arrays if a.job_id)})
    if as_json:
        print_json(rows)
    else:
        _table(["sweep_id", "tasks", "arrays", "created"], rows)


@app.command("resume")
@user_errors
def resume(sweep: SweepArg, profile: ProfileOpt = None, force: Annotated[bool, typer.Option(
        "--force", help="Start one here although the record says one runs on another login node, now gone.")
        ] = False) -> None:
    """Start a search's driver again (after the login node's reboot): no trial lost or run twice."""
    from slurmkit.runs import folders
    from slurmkit.sweeps import search_view

    paths = folders.find_sweep(run_root_for(profile), sweep)
    pid = search_view.resume(paths, force)
    typer.echo(f"driver started (pid {pid}): `slurmkit sweep status {paths.sweep_id}`" if pid is not None
               else "a driver already runs this search")


@app.command("cancel")
@user_errors
def cancel(sweep: SweepArg, profile: ProfileOpt = None) -> None:
    """Cancel every array of the sweep (and a search's driver)."""
    from slurmkit.runs import folders
    from slurmkit.sweeps import submit as sub

    ids = sub.cancel(folders.find_sweep(run_root_for(profile), sweep))
    typer.echo(f"cancelled {', '.join(ids) or 'nothing'}")


def _table(columns: list[str], rows: list[JsonObject], best: int | None = None) -> None:
    """Plain aligned columns (wide sweeps stay readable when piped); '*' marks the best row."""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[k]) for r in cells)]) for k, c in enumerate(columns)]
    typer.echo("  " + "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row, line in zip(rows, cells, strict=True):
        mark = "* " if best is not None and row.get("index") == best else "  "
        typer.echo(mark + "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
