"""Log to the run's experiment trackers from your own function or command (profile or spec
`tracking:`, docs/tracking.md): `slurmkit.tracking.log({"acc": 0.9}, step)`. Only rank 0 logs; on
other ranks, outside a slurmkit run, or where the run names no tracker, it does nothing."""

from __future__ import annotations

from slurmkit.worker.tracking import log

__all__ = ["log"]
