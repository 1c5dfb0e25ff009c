"""Cancelling a run: scancel its jobs, or interrupt a local run's controller."""

from __future__ import annotations

import signal

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
        # Only a controller that is still the process we started: its pid may have been reused.
        ids = [jid for jid in ids if procs.signal_process(jid, rec.pid_starts.get(jid), signal.SIGINT)]
    else:
        commands.scancel(ids)
    RunFile(paths).update(cancelled=True)
    return ids
