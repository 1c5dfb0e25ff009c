"""What a report draws (report.collect makes it; report's PNG and report_html's page draw it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from slurmkit.insight import goodput
from slurmkit.jsontypes import JsonObject


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


@dataclass(frozen=True)
class PartSpan:
    """One step of a heterogeneous run's part (supervisor.jsonl): from its launch to its end."""

    part: str
    restart_count: int
    attempt: int
    """The part's in-job attempt in that incarnation."""
    start: float
    end: float | None = None
    exit_code: int | None = None
    by_job: bool = False
    """Ended by the job (its primary part done, a stop, another part's failure), not by itself."""


def part_spans(events: list[JsonObject]) -> list[PartSpan]:
    """Each part's steps, oldest first, from the supervisor's launch and part_ended records."""
    spans: list[PartSpan] = []
    open_: dict[str, PartSpan] = {}
    for e in events:
        part = e.get("part")
        if not isinstance(part, str):
            continue
        if e.get("event") == "launch":
            open_[part] = PartSpan(part, int(e.get("restart_count") or 0), int(e.get("part_attempt") or 0),
                                   float(e["time"]))
            spans.append(open_[part])
        elif e.get("event") == "part_ended" and part in open_:
            done = open_.pop(part)
            spans[spans.index(done)] = PartSpan(done.part, done.restart_count, done.attempt, done.start,
                                                float(e["time"]), e.get("exit_code"), bool(e.get("by_job")))
    return spans


@dataclass
class ReportData:
    run_id: str
    steps: list[dict[str, float]]
    """The curve's points (at most about MAX_POINTS), oldest step first."""
    gpu: list[JsonObject]
    segments: list[Segment]
    accounting: goodput.Goodput
    summary: JsonObject = field(default_factory=dict)
    restarts: list[tuple[int, str]] = field(default_factory=list)
    """Every restart at the step training went on from (the checkpoint resumed, or the failed step's
    start for an in-job one), with its cause: marked on the curves."""
    scores: list[JsonObject] = field(default_factory=list)
    """Rank 0's straggler readings (scores.jsonl: time, median, slowest [[rank, score]...]), oldest first."""
    parts: list[PartSpan] = field(default_factory=list)
    """A heterogeneous run's parts' steps (spec components), oldest first; [] for any other run."""
    logged: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    """What the run's own code logged (logged.jsonl), by name: (step, mean value) points, oldest
    first, at most about MAX_POINTS a name and MAX_LOGGED names (the newest logged)."""


def headline(a: goodput.Goodput) -> str:
    """The goodput line both reports print. A run none of whose steps was timed (a command's or a
    function's own loop: only the built-in Trainer times its steps) says so rather than 0.0 %."""
    if a.steps == 0:
        return (f"{_secs(a.wall_s)} wall; goodput not measured: no step of this run was timed (the built-in "
                "Trainer times its steps, a script's own loop does not)")
    return (f"goodput {a.goodput:.1%} ({_secs(a.productive_s)} productive of {_secs(a.wall_s)} wall); lost: queue "
            f"{_secs(a.queue_wait_s)}, restarts {_secs(a.restart_overhead_s)}, recomputed {_secs(a.recomputed_s)}, "
            f"checkpoint stalls {_secs(a.checkpoint_stall_s)}, other {_secs(a.other_s)}"
            + (f", staging {_secs(a.staging_s)}" if a.staging_s else ""))


def _secs(seconds: float) -> str:
    """Seconds as a report prints them: tenths below ten, so a short run reads 0.4 s, not 0 s."""
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def rank_series(readings: list[JsonObject], most: int = 6) -> list[int]:
    """The ranks worth a line: those with the lowest scores any reading saw, at most `most`."""
    lowest: dict[int, float] = {}
    for r in readings:
        for rank, score in r["slowest"]:
            lowest[rank] = min(score, lowest.get(rank, 1.0))
    return sorted(lowest, key=lambda k: (lowest[k], k))[:most]
