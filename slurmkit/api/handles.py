"""Handles on what the Python API submitted: Job (a run, or one task of a map_array), SweepHandle,
as_completed. A Job is a small frozen dataclass of ids and paths: it pickles, travels into another
job, and `Job.from_id` rebuilds it in any process, from a run id or a Slurm job id.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmkit.api import submitit_names
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile
from slurmkit.common.sweep_layout import SweepPaths
from slurmkit.errors import JobFailedError
from slurmkit.jsontypes import JsonObject
from slurmkit.load.loader import load_profile, profile_name
from slurmkit.remote import api as remote_api
from slurmkit.remote.api import RemoteJob
from slurmkit.remote.forward import site_of
from slurmkit.runs import jobs
from slurmkit.runs import logs as run_logs
from slurmkit.runs.lookup import find
from slurmkit.runs.polling import Poller
from slurmkit.slurm import commands
from slurmkit.slurm.commands import TransientSlurmError
from slurmkit.sweeps.results import results, task_states, wait
from slurmkit.sweeps.search_view import SearchState, follow, search_state
from slurmkit.sweeps.study import Trial
from slurmkit.sweeps.submit import resubmit_failed


@dataclass(frozen=True)
class Job:
    """One run (a submit) or one task of a map_array (a sweep task, whose folder appears when it starts)."""

    run_id: str
    job_id: str
    """The Slurm job id at submit (ARRAY_TASK for a map_array task; the controller pid on local)."""
    run_dir: str

    @classmethod
    def from_id(cls, ident: str, profile: str | None = None) -> Job:
        """Reattach to a run (CLI- or Python-submitted) by run id, unique prefix, folder or Slurm job id.
        Through a profile's login host, a RemoteJob with the same methods."""
        if (site := site_of(profile)) is not None:
            return remote_api.from_id(site, profile_name(profile), ident)  # type: ignore[return-value]
        paths = find(load_profile(profile_name(profile)).run_root, ident)
        rec = RunFile(paths).read()
        return cls(rec.run_id, (rec.job_ids or [""])[-1], str(paths.run_dir))

    @property
    def paths(self) -> RunPaths:
        return RunPaths(Path(self.run_dir))

    if not TYPE_CHECKING:  # hidden from mypy, which would otherwise accept any attribute

        def __getattr__(self, name: str) -> Any:
            raise submitit_names.method_error("Job", name, submitit_names.JOB_METHODS)

    @property
    def started(self) -> bool:
        """Whether the run folder exists: always for a submit, once it starts for a map_array task."""
        return self.paths.record.exists()

    @property
    def state(self) -> str:
        """The Slurm state now (PENDING, RUNNING, COMPLETED, FAILED, ...): one squeue, at most one sacct."""
        return states([self])[self]

    def done(self) -> bool:
        return not jobs.is_active(self.state)

    def wait(self, timeout: float | None = None, poll_s: float = 1.0) -> str:
        """The final state, polling with back-off; TimeoutError if the job is still active after timeout s."""
        final = Poller(first_s=poll_s).until_ended(lambda: self.state, lambda st: {st} if jobs.is_active(st) else set(),
                                                   timeout, survive=(TransientSlurmError,))
        if jobs.is_active(final):
            raise TimeoutError(f"{self.run_id}: still {final} after {timeout} s")
        return final

    def result(self, timeout: float | None = None) -> Any:
        """Waits; rank 0's return value. A failed job raises JobFailedError with the failing rank's log tail."""
        return self.results(timeout, ranks=[0])[0]

    def results(self, timeout: float | None = None, ranks: list[int] | None = None) -> list[Any]:
        """Waits; every rank's return value, by rank."""
        final = self.wait(timeout)
        if not self.started:
            raise JobFailedError(f"ended {final} before it started", where=self.run_id, log_tail="")
        if ranks is None:
            ranks = list(range(RunFile(self.paths).read().num_tasks))
        return [jobs.result(self.paths, rank) for rank in ranks]

    def logs(self, rank: int | None = None) -> str:
        """Every rank's output so far, each line prefixed [rank] ([rank!] for stderr)."""
        return "\n".join(run_logs.logs(self.paths, rank)) if self.started else ""

    def cancel(self) -> list[str]:
        if self.started:
            return jobs.cancel(self.paths)

        commands.scancel([self.job_id])
        return [self.job_id]

    def resubmit(self, partition: str | None = None) -> Job:
        """The same run as a new job that resumes from its checkpoint (`slurmkit resubmit`)."""
        sub = jobs.resubmit(self.paths, partition)
        return Job(sub.run_id, str(sub.job_id), sub.run_dir)


def _sweep_of(job: Job) -> Path | None:
    """The sweep folder of a map_array task (<sweep>/tasks/<index>); None for a submitted run."""
    sweep_dir = Path(job.run_dir).parent.parent
    return sweep_dir if Path(job.run_dir).parent.name == "tasks" and SweepPaths(sweep_dir).manifest.exists() else None


def states(handles: list[Job]) -> dict[Job, str]:
    """The state of many jobs at once: one squeue for the runs (and at most one sacct), and one
    per map_array. A map_array task's state is always its sweep's view of it: its folder can exist
    before its job id is recorded there, and only the sweep knows it is still being submitted."""
    by_sweep: dict[Path, list[Job]] = {}
    runs = []
    for job in handles:
        sweep_dir = _sweep_of(job)
        if sweep_dir is None:
            runs.append(job)
        else:
            by_sweep.setdefault(sweep_dir, []).append(job)
    rows = jobs.statuses([(j.paths, RunFile(j.paths).read()) for j in runs])
    out = {j: row.state for j, row in zip(runs, rows, strict=True)}
    for sweep_dir, tasks in by_sweep.items():
        now = {s.index: s.state for s in task_states(SweepPaths(sweep_dir))}
        out.update((j, now[int(Path(j.run_dir).name)]) for j in tasks)
    return out


def as_completed(handles: Iterable[Job], timeout: float | None = None, poll_s: float = 1.0) -> Iterator[Job]:
    """Each job as it ends (in the order they end), polling all of them at once with back-off."""
    pending = list(dict.fromkeys(handles))
    poller = Poller(first_s=poll_s)
    while pending:
        now: dict[Any, str] = (remote_api.states(pending) if isinstance(pending[0], RemoteJob)  # type: ignore[arg-type]
                               else states(pending))
        for job in [j for j in pending if not jobs.is_active(now[j])]:
            pending.remove(job)
            yield job
        if pending:
            if timeout is not None and poller.elapsed() > timeout:
                raise TimeoutError(f"{len(pending)} job(s) still active after {timeout} s")
            poller.wait()


@dataclass(frozen=True)
class SweepHandle:
    """A submitted sweep: the library behind `slurmkit sweep status/results/resubmit`."""

    paths: SweepPaths

    @property
    def sweep_id(self) -> str:
        return self.paths.sweep_id

    def status(self) -> dict[int, str]:
        """Each task's state, by task index."""
        return {s.index: s.state for s in task_states(self.paths)}

    def wait(self, timeout: float | None = None) -> dict[int, str]:
        return {s.index: s.state for s in wait(self.paths, timeout_s=timeout)}

    def results(self) -> list[JsonObject]:
        """One row per task: index, state, the varying keys and the final metrics."""
        return results(self.paths).rows

    def resubmit(self, failed: bool = True) -> list[int]:
        """A new array of the tasks that ended failed, cancelled or timed out; their indices."""
        return resubmit_failed(self.paths, self.status()) if failed else []


@dataclass(frozen=True)
class SearchHandle(SweepHandle):
    """A search sweep (slurmkit.sweep(..., search=...)): its trials as the study holds them, and
    the best; `wait` follows the driver to the end of the search."""

    def trials(self) -> list[Trial]:
        """Every trial asked so far: number (its task index), state, params, value."""
        return search_state(self.paths).trials

    def best(self) -> Trial | None:
        """The completed trial with the best value so far (None before one completes)."""
        return search_state(self.paths).best

    def state(self) -> SearchState:
        return search_state(self.paths)

    def wait(self, timeout: float | None = None) -> dict[int, str]:
        """Until the driver ends (every trial ended, or the driver stopped); each trial's state."""
        return {t.number: t.state for t in follow(self.paths, timeout_s=timeout).trials}
