"""`slurmkit track RUN`: a run's offline W&B tracker runs sent from here (the login node), where the
compute nodes have no network. Each incarnation wrote one folder under the run folder's wandb/, all
with the run's id, so W&B joins them into one run."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from slurmkit.common import trust
from slurmkit.common.errors import SlurmkitError
from slurmkit.common.layout import RunPaths

SYNC_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Synced:
    folders: list[str]
    returncode: int
    output: str


def offline_runs(paths: RunPaths) -> list[Path]:
    """The run's offline W&B folders, each checked to be the caller's own."""
    found = sorted((paths.tracking_dir / "wandb").glob("offline-run-*"))
    for folder in found:
        trust.check(trust.reason(folder), str(folder), "valid: a run folder of your own")
    return found


def sync(paths: RunPaths, dry_run: bool = False, python: str = sys.executable) -> Synced:
    """`wandb sync` of every offline folder of the run (with dry_run: only what it would send)."""
    folders = offline_runs(paths)
    if not folders:
        raise SlurmkitError("no offline W&B run in the run folder", where=str(paths.run_dir),
                            valid="valid: a run with tracking.wandb: offline that has logged a step")
    argv = [python, "-P", "-m", "wandb", "sync", *(["--dry-run"] if dry_run else []), *map(str, folders)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=SYNC_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SlurmkitError(f"wandb sync did not end in {SYNC_TIMEOUT_S:g} s", where=str(paths.run_dir),
                            valid="valid: try again; the folders stay") from exc
    if "No module named wandb" in proc.stderr:
        raise SlurmkitError(f"wandb is not installed for {python}", where="tracking.wandb",
                            valid="valid: pip install 'slurmkit[tracking]' (or wandb) here")
    return Synced([str(f) for f in folders], proc.returncode, (proc.stdout + proc.stderr).strip())
