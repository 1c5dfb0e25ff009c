"""`slurmkit report RUN`."""

from __future__ import annotations

from typing import Annotated

import typer

from slurmkit.cli.common import JsonOpt, ProfileOpt, output_file, print_json, run_of, user_errors


@user_errors
def report(
    run: Annotated[str, typer.Argument(help="Run id, unique prefix, or run folder.")],
    output: Annotated[str | None, typer.Option("--output", "-o", help="report.png or report.html "
                                                "(default: report.png in the run folder).")] = None,
    profile: ProfileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Plot loss, throughput, MFU, GPU use and the timeline of every job, with the goodput accounting."""
    from slurmkit.insight import report as rep

    paths = run_of(profile, run)
    target = output_file(output, "--output") or paths.report
    data = rep.write(paths, target)
    a = data.accounting
    if as_json:
        print_json({"report": str(target), "goodput": a.as_dict(), "incarnations": len(data.segments),
                    "restart_causes": data.summary["restart_causes"], "lost_steps": data.summary["lost_steps"],
                    "in_job": data.summary["in_job"], "startup_s": [seg.startup for seg in data.segments],
                    "snapshot": data.summary["snapshot"], "cost": data.summary["cost"]})
        return
    typer.echo(f"{target}")
    typer.echo(f"goodput {a.goodput:.1%} ({a.productive_s:.0f} s productive of {a.wall_s:.0f} s wall, "
               f"{len(data.segments)} incarnation(s))")
    typer.echo(f"lost: queue {a.queue_wait_s:.1f} s, restarts {a.restart_overhead_s:.1f} s, recomputed steps "
               f"{a.recomputed_s:.1f} s, checkpoint stalls {a.checkpoint_stall_s:.1f} s, other {a.other_s:.1f} s")
    spent = data.summary["cost"]
    if spent["node_hours"]:
        typer.echo(f"cost: {spent['node_hours']:.3f} node-hours ({spent['gpu_hours']:.3f} GPU-hours), "
                   f"{spent['lost_node_hours']:.3f} of them lost")
    if n_in_job := sum(data.summary["in_job"]):
        typer.echo(f"in-job restarts (no requeue): {n_in_job}")
    if any(data.summary["lost_steps"]):
        typer.echo("steps run again after each restart: " + ", ".join(str(n) for n in data.summary["lost_steps"]))
    if snap := data.summary["snapshot"]:  # a record's snapshot may lack a field (an older or edited run.json)
        typer.echo(f"code snapshot: {snap.get('files', '?')} files, {snap.get('bytes', '?')} bytes from "
                   f"{snap.get('source', '?')} (commit {snap.get('git_commit') or '-'}"
                   f"{', dirty' if snap.get('dirty') else ''})")
    for seg in data.segments[1:]:
        if seg.startup:
            typer.echo(f"restart {seg.n} start-up (s): " + ", ".join(f"{k} {v:.2f}" for k, v in seg.startup.items()))
