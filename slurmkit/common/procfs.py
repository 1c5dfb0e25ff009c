"""Processes as /proc shows them, read by both sides: a local run's client (runs.procs: status,
cancel) and a local heterogeneous run's supervisor (supervisor.local_parts: what its parts left)."""

from __future__ import annotations

import os
from pathlib import Path


def group_members(pgid: int) -> list[int]:
    """The processes of group `pgid` that still run (a zombie, ended and not yet reaped, does not)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            found.append(int(entry.name))
    return found
