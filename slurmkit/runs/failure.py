"""Why a run failed, read on the login node: which rank to blame, its cause and frames (from its
outcome record, common.user_trace) and the tail of its log. `result`, `submit --wait`, `status` and
JobFailedError all say it this way."""

from __future__ import annotations

from dataclasses import dataclass

from slurmkit.common.layout import RunPaths
from slurmkit.common.outcomes import Outcome
from slurmkit.common.record import RunFile

LOG_TAIL_LINES = 20
NO_RECORD = "no outcome record: the rank was killed (out of memory, a signal) or lost its node"


@dataclass(frozen=True)
class Failure:
    rank: int
    cause: str
    """`ValueError: bad input`, `exit code 1: ModuleNotFoundError: ...`, or why there is none."""
    trace: tuple[str, ...]
    """The last frames of the user's own code (a command's last stderr lines), newest last."""
    log_tail: str
    """The rank's last lines of stdout, then of stderr (where a traceback ends), newlines kept."""
    full: str = ""
    """The rank's whole traceback as it recorded it, slurmkit's and submitit's frames included."""

    @property
    def headline(self) -> str:
        return f"rank {self.rank}: {self.cause}"


def blamed(found: list[tuple[int, Outcome | None]]) -> tuple[int, Outcome | None]:
    """The rank whose own error it was: the first error that is not a lost peer, else the first
    error, else the first rank that wrote no record."""
    errors = [(rank, o) for rank, o in found if o is not None and not o.ok]
    own = [(rank, o) for rank, o in errors if not o.peer_failed]
    missing = [(rank, o) for rank, o in found if o is None]
    return next(iter(own or errors or missing), (0, None))


def _blame(paths: RunPaths, job_id: str, num_tasks: int) -> tuple[int, Outcome | None]:
    return blamed([(rank, paths.outcome(job_id, rank)) for rank in range(num_tasks)])


def headline(paths: RunPaths, job_id: str, num_tasks: int) -> str:
    """`rank 1: ValueError: bad input`: what `status` shows of a failed run (outcome records only, no log)."""
    rank, outcome = _blame(paths, job_id, num_tasks)
    return f"rank {rank}: {NO_RECORD if outcome is None else outcome.cause or outcome.error_line}"


def failure(paths: RunPaths, job_id: str) -> Failure:
    """The failure of job `job_id` of the run, from its ranks' outcome records and logs."""
    rank, outcome = _blame(paths, job_id, RunFile(paths).read().num_tasks)
    out, err = (_lines(paths, job_id, rank, stream) for stream in ("out", "err"))
    tail = "\n".join([*out[-LOG_TAIL_LINES:], *err[-LOG_TAIL_LINES:]]) or "(no log)"
    if outcome is None:
        return Failure(rank, NO_RECORD, tuple(err[-5:]), tail)
    return Failure(rank, outcome.cause or outcome.error_line, tuple(outcome.trace), tail, outcome.error)


def _lines(paths: RunPaths, job_id: str, rank: int, stream: str) -> list[str]:
    log = paths.rank_log(job_id, rank, stream)
    try:
        return [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []
