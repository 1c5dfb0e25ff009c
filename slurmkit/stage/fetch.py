"""The data of a profile's `stage.data`, on one node (the batch shell runs this once per node, after
the environment is staged, with the node's copy of it): each item into ROOT/data-JOB/NAME, which
the ranks see as $SLURMKIT_STAGE/NAME.

A file the batch shell broadcast with sbcast (ROOT/.incoming-data-JOB-NAME) is moved into place;
otherwise a file or a folder is copied from the shared filesystem and an fsspec URI fetched, each
into a temporary name renamed into place once whole. Prints one JSON line (node, action "data",
seconds, bytes). A failure leaves the node's health report in the run folder and exits 1: that
node failed its health, and the job is requeued without it.

    python -P -m slurmkit.stage.fetch --root ROOT --job JOB --run-dir RUN [--item SOURCE NAME]...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from slurmkit import trust
from slurmkit.common.layout import RunPaths
from slurmkit.common.markers import HealthReport


def incoming(root: Path, job: str, name: str) -> Path:
    """Where the batch shell's sbcast leaves a file item on each node."""
    return root / f".incoming-data-{job}-{name}"


def fetch(source: str, dest: Path, broadcast: Path) -> None:
    """One item into `dest` (absent before): the broadcast copy, a copy of a path, or a fetched URI."""
    partial = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    if broadcast.is_file():
        broadcast.rename(dest)
        return
    if "://" in source and not source.startswith("file://"):
        import fsspec  # only where a URI is staged: the object store's client with it

        fs, path = fsspec.core.url_to_fs(source)
        fs.get(path, str(partial), recursive=fs.isdir(path))
    elif Path(source.removeprefix("file://")).is_dir():
        shutil.copytree(source.removeprefix("file://"), partial, symlinks=True)
    else:
        shutil.copyfile(source.removeprefix("file://"), partial)
    partial.rename(dest)


def size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmkit.stage.fetch")
    parser.add_argument("--root", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--item", nargs=2, action="append", default=[], metavar=("SOURCE", "NAME"))
    args = parser.parse_args(argv)
    node, t0 = socket.gethostname().split(".")[0], time.monotonic()
    root = Path(args.root)
    folder = root / f"data-{args.job}"
    try:
        trust.private_folder(root, "profile.stage.local_root", "the staged data")
        folder.mkdir(mode=0o700, exist_ok=True)
        for source, name in args.item:
            if not (folder / name).exists():
                fetch(source, folder / name, incoming(root, args.job, name))
        (folder / ".ready").touch()
    except Exception as exc:  # any failure is this node's: reported, never a traceback
        problem = f"stage: data: {type(exc).__name__}: {exc}"
        HealthReport(node, [problem], "stage", []).write(RunPaths(Path(args.run_dir)))
        print(f"slurmkit: {problem}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps({"node": node, "action": "data", "seconds": round(time.monotonic() - t0, 3),
                      "bytes": sum(size(p) for p in folder.iterdir()), "job": args.job,
                      "restart_count": int(os.environ.get("SLURM_RESTART_COUNT") or 0)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
