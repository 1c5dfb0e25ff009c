"""The marker files of a run folder that one process leaves for another: each one's schema, who
writes it and who reads it, and the only code that reads or writes them. RunPaths builds their paths.

- restart-request.json (RestartRequest): written by supervisor.effects.requeue (in the job's supervisor)
  before it asks Slurm; read by the next incarnation (supervisor.restarts).
- prune-request.json (PruneRequest): written by a search's driver (sweeps.search, on the login
  node) before it signals a trial's job to stop; read by the job's decider (supervisor.effects.state): a
  pruned trial ends at its stop, never restarted or requeued.
- stopping.json (StopMarker): written by rank 0 before the agreed stop's save (train.incarnation);
  read by the next start (supervisor.restarts.lost_steps).
- stopped.json (Stopped): written by rank 0 once the ranks stopped on a signal (and saved, where
  they keep checkpoints): the ranks' typed end of the step. Read by the job's supervisor, the one
  decider of what comes next (slurmkit.supervisor: requeue or not).
- hang-rankN.json (HangMarker): written by rank N's watchdog (train.incarnation), or as
  hang-rank-1.json by the supervisor's outside watch (supervisor.watch: no rank could say); read
  and removed by the policy after the step failed (cause hang, startup_hang).
- startup.json (StartupWatched): written by rank 0's startup watch (worker.ft.watchdog) when it
  begins and again at its first step; read by the supervisor's outside watch (supervisor.watch).
- health-NODE.json (HealthReport): written by the health gate on a node that fails it
  (worker.health); read and removed by the supervisor (supervisor.effects.health_failed).
- command-stop-JOB.RANK.json (CommandStop): written by a command run's script, from its
  slurmkit.Checkpoint (announced when made, the step at the agreed stop); read by that rank's
  worker (worker.command), which clears it before it starts the command.

- rank-process-JOB.RANK.json (RankProcess): written by each rank process when it starts
  (worker.rank); read by `slurmkit stack` (runs.stack) to tell a rank that did not answer from one
  that is stopped or gone.

- standby-go-JOB.N.K (StandbyGo, empty): touched by the supervisor when its standby ranks take
  attempt K of incarnation N; waited for by those ranks (standby), looked for by devcluster.ranks.
- injected-stepS (InjectedFault, empty): touched by the fault injection (train.faults) when a one-shot
  fault at step S fires, so that it fires once per run, whatever restarts follow.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from slurmkit import trust
from slurmkit.common.atomic import atomic_write_text
from slurmkit.common.cause import Cause
from slurmkit.common.layout import RunPaths
from slurmkit.jsontypes import JsonObject


def _read_json(path: Path) -> JsonObject | None:
    try:
        found = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None


@dataclass(frozen=True)
class RestartRequest:
    """Why the running job asked Slurm to requeue it, written before the ask."""

    cause: Cause
    step: int | None
    detail: str
    job_id: str
    restart_count: int
    """The incarnation that asked: a marker from another incarnation or job is stale, never read."""
    time: str

    def write(self, paths: RunPaths) -> None:
        atomic_write_text(paths.restart_request, json.dumps(asdict(self)) + "\n")

    @staticmethod
    def read(paths: RunPaths, job_id: str, restart_count: int) -> RestartRequest | None:
        """The request incarnation `restart_count` of the job left, if it is there and readable."""
        found = _read_json(paths.restart_request)
        if found is None or found.get("cause") not in set(Cause):
            return None
        if (found.get("job_id"), found.get("restart_count")) != (job_id, restart_count):
            return None
        return RestartRequest(Cause(found["cause"]), found.get("step"), str(found.get("detail", "")), job_id,
                              restart_count, str(found.get("time", "")))

    @staticmethod
    def clear(paths: RunPaths) -> None:
        paths.restart_request.unlink(missing_ok=True)


@dataclass(frozen=True)
class StopMarker:
    """The step the ranks agreed to stop at, written before its save: if the save never ends (killed
    after GraceTime) the next incarnation still knows how far the last one got."""

    step: int
    time: float

    def write(self, paths: RunPaths) -> None:
        atomic_write_text(paths.stop_marker, json.dumps(asdict(self)) + "\n")

    @staticmethod
    def read(paths: RunPaths) -> StopMarker | None:
        found = _read_json(paths.stop_marker)
        try:
            return StopMarker(int(found["step"]), float(found.get("time", 0.0))) if found else None
        except (KeyError, TypeError, ValueError):
            return None

    @staticmethod
    def clear(paths: RunPaths) -> None:
        paths.stop_marker.unlink(missing_ok=True)


@dataclass(frozen=True)
class PruneRequest:
    """The pruner's verdict on a running trial: stop it, and never start it again."""

    step: int
    """The step of the intermediate value the pruner judged."""
    value: float
    time: str

    def write(self, paths: RunPaths) -> None:
        atomic_write_text(paths.prune_request, json.dumps(asdict(self)) + "\n")

    @staticmethod
    def read(paths: RunPaths) -> PruneRequest | None:
        found = _read_json(paths.prune_request)
        if found is None or not isinstance(found.get("step"), int) or not isinstance(found.get("value"), int | float):
            return None
        return PruneRequest(found["step"], float(found["value"]), str(found.get("time", "")))


@dataclass(frozen=True)
class Stopped:
    """The ranks' step ended because they stopped on a signal: at `step` (None: a run without steps,
    a command or a function stopped where it was), on the profile's requeue signal or on SIGTERM.
    What that means (a preemption, the time limit, a cancel) and what comes next, the supervisor decides."""

    job_id: str
    restart_count: int
    attempt: int
    """The step this was (the incarnation's in-job attempt): one left by another is stale, never read."""
    step: int | None
    requeue_signal: bool
    time: float

    def write(self, paths: RunPaths) -> None:
        atomic_write_text(paths.stopped, json.dumps(asdict(self)) + "\n")

    @staticmethod
    def read(paths: RunPaths, job_id: str, restart_count: int, attempt: int) -> Stopped | None:
        """The stop of that very step, if it was one and its record is readable."""
        found = _read_json(paths.stopped)
        if found is None or (found.get("job_id"), found.get("restart_count"), found.get("attempt")) != (
                job_id, restart_count, attempt):
            return None
        step = found.get("step")
        return Stopped(job_id, restart_count, attempt, step if isinstance(step, int) else None,
                       found.get("requeue_signal") is True, float(found.get("time") or 0.0))


@dataclass(frozen=True)
class HangMarker:
    """A rank's watchdog fired: no step for `idle_s` seconds (`startup`: no first step yet, the
    startup timeout's watch fired)."""

    rank: int
    """-1: the supervisor's outside watch, for the whole step (every rank frozen)."""
    idle_s: float
    time: float
    startup: bool = False

    def write(self, paths: RunPaths) -> None:
        atomic_write_text(paths.hang_marker(self.rank), self.describe() + "\n")

    def describe(self) -> str:
        """The restart's detail: the marker as its file holds it (JSON: rank, idle_s, time, startup)."""
        return json.dumps(asdict(self))

    @staticmethod
    def any(paths: RunPaths) -> bool:
        """Whether some rank's hang marker is there (left in place)."""
        return bool(paths.hang_markers())

    @staticmethod
    def take_all(paths: RunPaths) -> list[HangMarker]:
        """Every rank's hang marker, by rank; removed. One that cannot be read still says a rank hung."""
        found = []
        for path in paths.hang_markers():
            data = _read_json(path)
            try:
                found.append(HangMarker(**data) if data is not None else HangMarker(-1, 0.0, 0.0))
            except TypeError:
                found.append(HangMarker(-1, 0.0, 0.0))
            path.unlink(missing_ok=True)
        return found

    @staticmethod
    def now(rank: int, idle_s: float, startup: bool = False) -> HangMarker:
        return HangMarker(rank, round(idle_s, 1), time.time(), startup)


@dataclass(frozen=True)
class StartupWatched:
    """Rank 0's startup watch in this step (job, incarnation, attempt): begun at `begun` for
    `timeout_s`, ended at `first_step` (None: not yet)."""

    job_id: str
    restart_count: int
    attempt: int
    begun: float
    timeout_s: float
    first_step: float | None = None

    def write(self, paths: RunPaths) -> None:
        atomic_write_text(paths.startup_marker, json.dumps(asdict(self)) + "\n")

    @staticmethod
    def read(paths: RunPaths, job_id: str, restart_count: int, attempt: int) -> StartupWatched | None:
        """This step's record; None where there is none (an unwatched run, an older step's, unreadable)."""
        found = _read_json(paths.startup_marker)
        try:
            watched = StartupWatched(**found) if found is not None else None
        except TypeError:
            return None
        if watched is None or (watched.job_id, watched.restart_count, watched.attempt) != (job_id, restart_count,
                                                                                          attempt):
            return None
        return watched


@dataclass(frozen=True)
class Straggler:
    """A rank scoring below the profile's straggler_score for a window of readings (worker.ft.straggler)."""

    rank: int
    node: str
    score: float
    """The fastest rank's median step work over this rank's: 1.0 is the fastest."""
    since: float
    """When its first reading below the score came (epoch seconds)."""


@dataclass(frozen=True)
class Stragglers:
    """The ranks named now, written by rank 0 whenever that changes (none: an empty list)."""

    ranks: list[Straggler]

    def write(self, paths: RunPaths) -> None:
        atomic_write_text(paths.straggler_marker, json.dumps([asdict(s) for s in self.ranks]) + "\n")

    @staticmethod
    def read(paths: RunPaths) -> list[Straggler]:
        """The ranks named at the last reading; none where the file is missing or not a list of them."""
        try:
            found = json.loads(paths.straggler_marker.read_text())
            return [Straggler(**s) for s in found] if isinstance(found, list) else []
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError, TypeError):
            return []


@dataclass(frozen=True)
class HealthReport:
    """Why `node` failed the health gate."""

    node: str
    problems: list[str]
    source: str
    """Where the GPU list came from (NVML, nvidia-smi, none)."""
    gpus: list[JsonObject]

    def write(self, paths: RunPaths) -> None:
        # 0666 narrowed by the job's umask; written beside and renamed, never through a planted symlink.
        atomic_write_text(paths.health_marker(self.node), json.dumps(asdict(self)) + "\n", mode=0o666)

    @staticmethod
    def take_all(paths: RunPaths) -> list[HealthReport]:
        """Every failed node's report; removed."""
        found = []
        for path in paths.health_markers():
            report = _read_json(path)
            if report is not None and isinstance(report.get("node"), str):
                found.append(HealthReport(report["node"], [str(p) for p in report.get("problems") or []],
                                          str(report.get("source") or ""), list(report.get("gpus") or [])))
            path.unlink()
        return found


@dataclass(frozen=True)
class StandbyGo:
    """The supervisor hands in-job attempt `attempt` of incarnation `restart_count` of the job to its
    standby ranks: a later incarnation, or a resubmitted job, has standby ranks of its own."""

    job_id: str
    restart_count: int
    attempt: int

    def give(self, paths: RunPaths) -> None:
        trust.touch(paths.standby_go(self.job_id, self.restart_count, self.attempt))

    def given(self, paths: RunPaths) -> bool:
        return paths.standby_go(self.job_id, self.restart_count, self.attempt).exists()


class InjectedFault:
    """A one-shot injected fault that has fired, kept in the run folder across restarts."""

    @staticmethod
    def fire_once(paths: RunPaths, step: int) -> bool:
        """True the first time for `step` in this run: the marker is made then."""
        marker = paths.injected_marker(step)
        if marker.exists():
            return False
        trust.touch(marker)
        return True


COMMAND_STOP_ENV = "SLURMKIT_COMMAND_STOP"
"""Set by a command rank's worker for the command: the path of its CommandStop marker."""


@dataclass(frozen=True)
class CommandStop:
    """A command run's script has a slurmkit.Checkpoint, so it stops at an agreed step rather than be
    terminated (`step` None: announced, still running); `step` once it stopped there and saved."""

    step: int | None = None
    requeue: bool = False
    """The stop was the requeue signal (else SIGTERM)."""

    def write(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(asdict(self)) + "\n")

    @staticmethod
    def read(path: Path) -> CommandStop | None:
        found = _read_json(path)
        if found is None:
            return None
        step = found.get("step")
        return CommandStop(step if isinstance(step, int) else None, found.get("requeue") is True)

    @staticmethod
    def prepared(paths: RunPaths, job_id: str, rank: int) -> Path:
        """Rank `rank`'s marker path, with what an earlier incarnation of the job left there removed."""
        path = paths.command_stop(job_id, rank)
        path.unlink(missing_ok=True)
        return path


STACK_SIGNAL = "WINCH"
"""What `slurmkit stack` sends a job's processes: each rank process dumps every thread's Python
stack to its log (faulthandler, registered by worker.rank). Its default action is to ignore it, so
a process that does not handle it (a launcher, a user's command, the batch shell) is not harmed."""


@dataclass(frozen=True)
class RankProcess:
    """Where a rank process runs: what `slurmkit stack` looks at when the rank does not answer."""

    host: str
    pid: int
    time: float

    def write(self, paths: RunPaths, job_id: str, rank: int) -> None:
        atomic_write_text(paths.rank_process(job_id, rank), json.dumps(asdict(self)) + "\n")

    @staticmethod
    def read(paths: RunPaths, job_id: str, rank: int) -> RankProcess | None:
        found = _read_json(paths.rank_process(job_id, rank))
        if found is None or not isinstance(found.get("pid"), int):
            return None
        return RankProcess(str(found.get("host", "")), found["pid"], float(found.get("time", 0.0)))
