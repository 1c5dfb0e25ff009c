"""Cancelling a run: scancel its jobs, or interrupt a local run's controller."""

from __future__ import annotations

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.runs import procs
from slurmkit.slurm import commands


def cancel(paths: RunPaths) -> list[str]:
    rec = RunFile(paths).read()
    ids = list(rec.job_ids)
    if not ids:
        return []
    if rec.executor == "local":
        # Only a controller that is still the process we started (its pid may have been reused),
        # and with it every process of its group (procs.end_group).
        ids = [jid for jid in ids if procs.end_group(jid, rec.pid_starts.get(jid))]
    else:
        commands.scancel(ids)
    RunFile(paths).update(cancelled=True)
    return ids
