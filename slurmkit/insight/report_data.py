"""What a report draws (report.collect makes it; report's PNG and report_html's page draw it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slurmkit.insight import goodput


@dataclass
class Segment:
    """One incarnation on the timeline: queued from `queued`, running from `start` to `end`."""

    job_id: str
    n: int
    queued: float | None
    start: float | None
    end: float | None
    state: str
    nodes: str
    cause: str = ""
    """Why this incarnation ended and the run was restarted (run.json), empty for the last one."""
    startup: dict[str, float] = field(default_factory=dict)
    """Seconds in each start-up phase, from its first step's record (goodput.startup_spans)."""
    in_job: list[tuple[float, str]] = field(default_factory=list)
    """In-job restarts inside this incarnation (a new srun step, no requeue): when, and the cause."""


@dataclass
class ReportData:
    run_id: str
    steps: list[dict[str, float]]
    """The curve's points (at most about MAX_POINTS), oldest step first."""
    gpu: list[dict[str, Any]]
    segments: list[Segment]
    accounting: goodput.Goodput
    summary: dict[str, Any] = field(default_factory=dict)
    restarts: list[tuple[int, str]] = field(default_factory=list)
    """Every restart at the step training went on from (the checkpoint resumed, or the failed step's
    start for an in-job one), with its cause: marked on the curves."""
