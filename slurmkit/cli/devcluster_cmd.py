"""`slurmkit devcluster up | down | status`."""

from __future__ import annotations

from typing import Annotated

import typer

from slurmkit.cli.common import JsonOpt, print_json, user_errors
from slurmkit.devcluster import names

app = typer.Typer(no_args_is_help=True, help="A real multi-node Slurm cluster on this machine (root only).")


def _log(msg: str) -> None:
    typer.echo(f"devcluster: {msg}", err=True)


@app.command()
@user_errors
def up(
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="Number of compute nodes (>= 2).")] = 2,
    purge: Annotated[bool, typer.Option("--purge", help="Wipe old controller state and accounting first.")] = False,
    max_array_size: Annotated[int, typer.Option(help="slurm.conf MaxArraySize (largest array index + 1).")
                              ] = names.MAX_ARRAY_SIZE,
    max_job_count: Annotated[int, typer.Option(help="slurm.conf MaxJobCount (jobs slurmctld holds).")
                             ] = names.MAX_JOB_COUNT,
    no_accounting: Annotated[bool, typer.Option("--no-accounting", help="No slurmdbd: "
                                                "AccountingStorageType=accounting_storage/none, as on some clusters.")
                             ] = False,
    min_job_age: Annotated[int, typer.Option(help="slurm.conf MinJobAge: seconds squeue shows a finished job.")
                           ] = names.MIN_JOB_AGE_S,
    gpus_per_node: Annotated[int, typer.Option(help="Declare this many GPUs a node as GRES (stand-in device files).")
                             ] = 0,
    preempt_user_signal: Annotated[bool, typer.Option(help="Preemption sends the job's --signal first, then "
                                                      "SIGTERM at GraceTime's end (preempt_send_user_signal).")
                                   ] = False,
) -> None:
    """Install (if missing) and start munge, mariadb, slurmdbd, slurmctld and N slurmd; wait until idle."""
    from slurmkit.devcluster import cluster

    cluster.up(nodes, purge=purge, log=_log, variant=names.Variant(
        max_array_size=max_array_size, max_job_count=max_job_count, accounting=not no_accounting,
        min_job_age_s=min_job_age, gpus_per_node=gpus_per_node, preempt_user_signal=preempt_user_signal))


@app.command()
@user_errors
def down(purge: Annotated[bool, typer.Option("--purge", help="Also wipe controller state.")] = False) -> None:
    """Stop exactly the daemons `up` started, by pid."""
    from slurmkit.devcluster import cluster

    cluster.down(purge=purge, log=_log)


@app.command()
@user_errors
def status(as_json: JsonOpt = False) -> None:
    """Show the daemons `up` started and the nodes' states."""
    from slurmkit.devcluster import cluster

    st = cluster.status()
    if as_json:
        print_json(st)
        return
    for name, d in st["daemons"].items():
        typer.echo(f"{name:16} pid {d['pid']:<8} {'running' if d['alive'] else 'dead'}")
    typer.echo(f"controller {'up' if st['controller'] else 'down'}; nodes: "
               + ", ".join(f"{k}={v}" for k, v in sorted(st["node_states"].items())))
