"""`slurmkit track RUN`, from the login node, for a run with `tracking:`:
- an ended run's goodput accounting (computed here from sacct, as `status` does) goes to its
  trackers as end-of-run numbers, through the ranks' interpreter, which has the trackers' packages;
- its offline W&B runs are sent, where the compute nodes have no network. Each incarnation wrote one
  folder under the run folder's wandb/, all with the run's id, so W&B joins them into one run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from slurmkit import trust
from slurmkit.common.layout import RunPaths
from slurmkit.common.metrics import is_number
from slurmkit.common.record import RunFile
from slurmkit.errors import SlurmkitError
from slurmkit.runs import jobs

SYNC_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Synced:
    folders: list[str]
    """The offline W&B folders sent (none: the run has no offline W&B run)."""
    returncode: int
    output: str
    accounting: dict[str, float] | None = None
    """The goodput accounting sent to the trackers; None while the run is active, or without one."""


def offline_runs(paths: RunPaths) -> list[Path]:
    """The run's offline W&B folders, each checked to be the caller's own."""
    found = sorted((paths.tracking_dir / "wandb").glob("offline-run-*"))
    for folder in found:
        trust.check(trust.reason(folder), str(folder), "valid: a run folder of your own")
    return found


def track(paths: RunPaths, dry_run: bool = False) -> Synced:
    """The accounting to the trackers (an ended run), then `wandb sync` of its offline folders
    (dry_run: nothing sent, `wandb sync --dry-run` says what would be)."""
    record = RunFile(paths).read()
    if record.tracking() is None:
        raise SlurmkitError(f"run {paths.run_id} names no tracker", where=str(paths.record),
                            valid="valid: a run with tracking: in its spec or profile (docs/tracking.md)")
    python = os.path.expanduser(record.profile.python or sys.executable)
    accounting = None if dry_run else send_accounting(paths, python)
    folders = offline_runs(paths)
    if not folders:
        return Synced([], 0, "no offline W&B run to send", accounting)
    return _wandb_sync(paths, folders, dry_run, python, accounting)


def send_accounting(paths: RunPaths, python: str) -> dict[str, float] | None:
    """An ended run's goodput and cost (its status's accounting) to its trackers."""
    st = jobs.run_state(paths)
    if jobs.is_active(st.state):
        return None
    values = {k: float(v) for k, v in st.accounting.items() if is_number(v)}
    if not values:
        return None
    _run([python, "-P", "-m", "slurmkit.worker.tracking", str(paths.run_dir), json.dumps(values)], paths,
         "the accounting to the trackers")
    return values


def _wandb_sync(paths: RunPaths, folders: list[Path], dry_run: bool, python: str,
                accounting: dict[str, float] | None) -> Synced:
    argv = [python, "-P", "-m", "wandb", "sync", *(["--dry-run"] if dry_run else []), *map(str, folders)]
    proc = _run(argv, paths, "wandb sync", check=False)
    if "No module named wandb" in proc.stderr:
        raise SlurmkitError(f"wandb is not installed for {python}", where="tracking.wandb",
                            valid="valid: pip install 'slurmkit[tracking]' (or wandb) here")
    return Synced([str(f) for f in folders], proc.returncode, (proc.stdout + proc.stderr).strip(), accounting)


def _run(argv: list[str], paths: RunPaths, what: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=SYNC_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SlurmkitError(f"{what} did not end in {SYNC_TIMEOUT_S:g} s", where=str(paths.run_dir),
                            valid="valid: try again; nothing is lost") from exc
    if check and proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SlurmkitError(f"{what} failed: {tail}", where=str(paths.run_dir),
                            valid="valid: the ranks' python with the trackers' packages (slurmkit[tracking])")
    return proc
