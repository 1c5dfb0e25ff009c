"""A run's rank logs: every rank's lines, prefixed, followed until the run ends (`slurmkit logs`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.runs.jobs import is_active, run_state
from slurmkit.runs.jobs.status import component_paths
from slurmkit.runs.polling import Poller


def _log_files(paths: RunPaths, rank: int | None, component: str | None) -> list[tuple[str, Path]]:
    files: list[tuple[str, Path]] = []
    record = RunFile(paths).read()
    own = component_paths(paths, record, component) if component is not None else paths
    for jid in record.job_ids:
        ranks = [rank] if rank is not None else list(own.rank_logs(jid))
        for rk in ranks:
            for stream in ("out", "err"):
                label = f"[{rk}]" if stream == "out" else f"[{rk}!]"
                files.append((label, own.rank_log(jid, rk, stream)))
    return files


def logs(paths: RunPaths, rank: int | None = None, follow: bool = False,
         poll_s: float = 1.0, component: str | None = None) -> Iterator[str]:
    """Every rank's lines prefixed [rank] ([rank!] for stderr); follow until the run ends. Files are
    read every poll_s; Slurm is asked whether the run has ended only as often as a Poller allows.
    `component`: a heterogeneous run's part, whose ranks' logs are its own folder's (its primary
    part's are the run's)."""
    offsets: dict[Path, int] = {}
    partial: dict[Path, str] = {}
    poller = Poller(first_s=poll_s)
    while True:
        # Read the state before the files, so lines written just before the end are not missed.
        done = not follow or (poller.due() and not is_active(run_state(paths).state))
        for label, path in _log_files(paths, rank, component):
            if not path.exists():
                continue
            with open(path, errors="replace") as f:
                f.seek(offsets.get(path, 0))
                chunk = partial.pop(path, "") + f.read()
                offsets[path] = f.tell()
            *complete, rest = chunk.split("\n")
            if rest:
                if done:
                    complete.append(rest)
                else:
                    partial[path] = rest
            for line in complete:
                yield f"{label} {line}"
        if done:
            return
        time.sleep(poll_s)
