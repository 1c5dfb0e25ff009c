"""`slurmkit bench allreduce | fs`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from slurmkit.cli.common import JsonOpt, ProfileOpt, SetOpt, print_json, table_console, user_errors

app = typer.Typer(no_args_is_help=True, help="Benchmarks: all-reduce over the cluster, filesystem throughput.")


@app.command()
@user_errors
def allreduce(
    profile: ProfileOpt = None,
    nodes: Annotated[int | None, typer.Option("--nodes", "-N", help="Nodes (default: the profile's).")] = None,
    max_bytes: Annotated[int, typer.Option("--max-bytes", help="Largest message, from 8 B up.")] = 256 * 1024**2,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """All-reduce time, algbw and busbw from 8 B to 256 MB over every rank, with a memcpy baseline."""
    from slurmkit.common.layout import RunPaths
    from slurmkit.load.loader import resolve
    from slurmkit.runs import jobs

    spec = {"name": "bench-allreduce", "callable": "slurmkit.bench.allreduce:run",
            "kwargs": {"max_bytes": max_bytes}, "resources": {"nodes": nodes} if nodes else {}}
    sub = jobs.submit(resolve(spec, profile, set_ or []))
    paths = RunPaths(Path(sub.run_dir))
    jobs.wait(paths, poll_s=1.0)
    result = jobs.result(paths)
    if as_json:
        print_json({"run_id": sub.run_id, **result})
        return
    from rich.table import Table

    table = Table("bytes", "time (us)", "algbw GB/s", "busbw GB/s", "memcpy GB/s",
                  title=f"all_reduce, {result['world_size']} ranks, {result['backend']} (run {sub.run_id})")
    for r in result["rows"]:
        table.add_row(str(r["bytes"]), f"{r['time_us']:.1f}", f"{r['algbw_GBps']:.3f}", f"{r['busbw_GBps']:.3f}",
                      f"{r['memcpy_GBps']:.2f}")
    table_console().print(table)


@app.command()
@user_errors
def fs(
    uri: Annotated[str, typer.Argument(help="Folder or fsspec URI to test, e.g. the checkpoint root.")],
    size: Annotated[str, typer.Option("--size", help="Bytes to write and read back, e.g. 256MB, 1GB.")] = "1GB",
    checkpoint_size: Annotated[str | None, typer.Option(
        "--checkpoint-size", help="Estimate the save time of a checkpoint this big (default: --size).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Checkpoint-style write (fsync, rename) and read throughput through fsspec, against dd on the same path."""
    from slurmkit.bench import fs as fs_bench

    result = fs_bench.run(uri, fs_bench.check_size(fs_bench.parse_size(size)),
                          fs_bench.parse_size(checkpoint_size, "--checkpoint-size") if checkpoint_size else None)
    if as_json:
        print_json(result)
        return
    typer.echo(f"{uri}: write {result['write_MBps']} MB/s, read {result['read_MBps']} MB/s ({result['bytes']} bytes)")
    if "write_vs_dd" in result:
        typer.echo(f"  dd on the same path: write {result['dd_write_MBps']} MB/s, read {result['dd_read_MBps']} MB/s"
                   f" -> write {result['write_vs_dd']}x, read {result['read_vs_dd']}x of dd")
    elif "write_vs_put" in result:
        typer.echo(f"  the client's own upload of the same bytes: {result['put_write_MBps']} MB/s"
                   f" -> write {result['write_vs_put']}x of it")
    else:
        typer.echo(f"  {result['baseline']}")
    typer.echo(f"  a {result['checkpoint_bytes'] / 1e9:.2f} GB checkpoint would take about "
               f"{result['estimated_save_s']} s")
