"""Cancelling a run: scancel its jobs, or interrupt a local run's controller."""

from __future__ import annotations

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.runs import procs
from slurmkit.runs.polling import Poller
from slurmkit.slurm import commands

RELAUNCH_WATCH_S = 30.0
"""How long cancel watches its jobs end, cancelling again one that Slurm requeued instead."""


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
        _until_ended(ids)
    RunFile(paths).update(cancelled=True)
    return ids


def _until_ended(ids: list[str]) -> None:
    """Watch the cancelled jobs end (polling backs off). A job cancelled while Slurm was launching it
    (allocated, its batch step not yet started) is requeued by Slurm instead ("Requeuing JobId" in
    slurmctld's log: seen in CI) and would run again from the queue: once it shows PENDING it is
    cancelled again."""

    def states() -> dict[str, commands.JobInfo]:
        found = commands.job_states(ids)
        if again := [j for j in ids if j in found and found[j].state == "PENDING"]:
            commands.scancel(again)
        return found

    Poller(first_s=0.5, max_s=2.0).until_ended(
        states, lambda found: {i.state for j, i in found.items() if j in ids and i.active},
        RELAUNCH_WATCH_S, survive=(commands.TransientSlurmError,))
