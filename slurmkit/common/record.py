"""run.json as a typed record (RunRecord) and its file (RunFile, the one reader and writer: every
change goes through its `update` or `editing`, under its lock); the entries it holds (RestartEntry,
Failure, UnhealthyNode, Preempted, SweepRef); the restart budget arithmetic over them; how a spec
or profile another slurmkit version wrote is read (readable).
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, StringConstraints, ValidationError, model_validator

from slurmkit.common.cause import Cause
from slurmkit.common.layout import RunPaths
from slurmkit.common.locked import LockedJson, Record, assign
from slurmkit.config.profile import ClusterProfile, Resources
from slurmkit.config.runspec import RunSpec
from slurmkit.config.tracking import Tracking
from slurmkit.jsontypes import JsonObject

MAX_TASKS = 1_000_000
JobId = Annotated[str, StringConstraints(pattern=r"^\d+(?:_\d+)?$")]
"""A Slurm job id, "123" or "123_4" (trust.JOB_ID_RE), or a local run's controller pid."""


class RestartEntry(Record):
    """One entry of run.json's `restarts`: what started an incarnation or an in-job step, why, and
    what it cost."""

    kind: Literal["requeue", "in_job", "warm", "resubmit"]
    """requeue: Slurm requeued the job (incarnation `n`); in_job: a new srun step in the allocation;
    warm: the ranks restarted in their processes; resubmit: `slurmkit resubmit` (a new job id)."""
    n: int
    """The incarnation (SLURM_RESTART_COUNT) it started, or happened in."""
    job_id: str
    cause: Cause
    detail: str = ""
    time: str
    in_job: int | None = None
    """in_job, warm: which in-job restart of the incarnation (1, 2, ...)."""
    step: int | None = None
    """in_job, warm: the step the failure happened at."""
    resumed_step: int | None = None
    """The step the ranks resumed from (learned by rank 0 at its start)."""
    lost_steps: int | None = None
    """Steps run again: those past the checkpoint resumed from."""
    exclude: list[str] | None = None
    """in_job: held nodes the next step leaves out."""
    nodes_lost: list[str] | None = None
    """in_job: nodes the job lost since its last in-job restart."""
    nodes: int | None = None
    """in_job: the node count of the next step."""
    live: bool | None = None
    """warm: restored from the live state (no step lost), not the host copy."""


class Failure(Record):
    """An error the restart policy has seen (a deterministic one ends the run when seen twice)."""

    error: str | None = None
    """The error's signature (its exception line)."""
    step: int | None = None
    time: str = ""
    node: str | None = None
    """The one node whose ranks raised by themselves, where the job spans more and their nodes are
    known (a node whose ranks crash twice in a run is blamed in the node ledger)."""


class UnhealthyNode(Record):
    """A node that failed the health gate (common.markers.HealthReport), and when."""

    node: str
    problems: list[str] = []
    source: str = ""
    gpus: list[JsonObject] = []
    time: str = ""


class Preempted(Record):
    """A preemption Slurm ended for good (PreemptMode=CANCEL): the job is COMPLETED in Slurm's eyes."""

    job_id: str
    step: int | None = None
    detail: str = ""
    time: str = ""


class SweepRef(Record):
    """A sweep task's run: which sweep, which task, what it overrides."""

    sweep_id: str
    index: int
    overrides: JsonObject = {}
    seed: int | None = None


class RunRecord(Record):
    """run.json: what the run is (spec, profile, resources as validated at submit), every job id it
    ever had, its restarts and their causes, and the verdicts that end it."""

    run_id: str
    name: str = ""
    run_dir: str = ""
    created: str = ""
    executor: str = ""
    """slurm or local."""
    profile_name: str = ""
    spec_source: str = ""
    spec: RunSpec | None = None
    """The run spec as validated at submit; None only in a record whose spec this slurmkit cannot read
    at all (kept in `unread`)."""
    profile: ClusterProfile = Field(default_factory=ClusterProfile)
    """The cluster profile as validated at submit (its `requeue` budgets among it)."""
    resources: Resources = Field(default_factory=Resources)
    """The resources the job asked for, every layer applied."""
    unread: JsonObject | None = None
    """What another slurmkit version wrote into spec, profile or resources that this one cannot read:
    a key it does not know, or a value it now refuses, kept here as written (by field, then path)."""
    num_tasks: Annotated[int, Field(strict=True, ge=1, le=MAX_TASKS)] = 1
    job_ids: list[JobId] = []
    pid_starts: dict[str, int] = {}
    """A local run's controller pid → its start time (runs.procs), so a reused pid is not taken for it."""
    script: str | None = None
    """The sbatch script submitted (also script.sh)."""
    snapshot: JsonObject | None = None
    """The code snapshot taken at submit (runs.snapshot)."""
    env: JsonObject | None = None
    """The environment staged to the nodes (profile stage.env): its hash, Python, every distribution and version."""
    sweep: SweepRef | None = None
    restarts: list[RestartEntry] = []
    failures: list[Failure] = []
    unhealthy: list[UnhealthyNode] = []
    excluded_nodes: list[str] = []
    """Nodes every requeue asks Slurm to keep the job off."""
    exclusion: str | None = None
    """What the last exclusion did."""
    final: str | None = None
    """Why the run must not be restarted again (a budget spent, a deterministic error)."""
    cancelled: bool | None = None
    preempted: Preempted | None = None
    goodput: JsonObject | None = None
    """The goodput accounting (insight.goodput) of the last job that finished, with its job_id."""

    @model_validator(mode="before")
    @classmethod
    def _other_versions(cls, data: object) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        unread = dict(data.get("unread") or {})
        for field, model in (("spec", RunSpec), ("profile", ClusterProfile), ("resources", Resources)):
            if isinstance(data.get(field), dict):
                data[field], dropped = readable(model, data[field])
                if dropped:
                    unread[field] = {**unread.get(field, {}), **dropped}
        data["unread"] = unread or None
        return data

    def tracking(self) -> Tracking | None:
        """The run's `tracking:` as submitted (the spec's replaces the profile's); None when it names
        no tracker."""
        tracking = self.spec.tracking if self.spec and self.spec.tracking else self.profile.tracking
        return tracking if tracking and tracking.any else None

    def budget(self, cause: Cause) -> int:
        """The profile's `requeue` budget for cause (Cause.budget_key)."""
        return int(getattr(self.profile.requeue, Cause(cause).budget_key, 0))  # resubmit has none

    def spent(self, cause: Cause) -> int:
        """Restarts that spent cause's budget: an external requeue's spent the preemption budget."""
        key = Cause(cause).budget_key
        return sum(1 for r in self.restarts if r.cause.budget_key == key)

    def left(self, cause: Cause) -> int:
        return self.budget(cause) - self.spent(cause)

    def allowed(self, cause: Cause) -> bool:
        return not self.final and self.spent(cause) < self.budget(cause)

    def in_job_entries(self, job_id: str, restart_count: int) -> list[RestartEntry]:
        """Incarnation `restart_count`'s in-job restarts, warm and cold."""
        return [r for r in self.restarts if r.job_id == job_id and r.n == restart_count and r.in_job]

    def in_job_left(self, job_id: str, restart_count: int) -> bool:
        """The profile's requeue.in_job is per incarnation, warm and cold restarts together."""
        return len(self.in_job_entries(job_id, restart_count)) < self.profile.requeue.in_job

    def started_by(self, job_id: str, restart_count: int, attempt: int = 0) -> RestartEntry | None:
        """The entry that started incarnation `restart_count`'s srun step `attempt` (0: the
        incarnation itself, by a requeue or a resubmit; 1..: an in-job restart)."""
        return next((r for r in self.restarts if r.job_id == job_id and r.n == restart_count
                     and (r.in_job or 0) == attempt and r.kind != "warm"), None)

    def add_job_id(self, job_id: str, pid_start: int | None = None) -> bool:
        """Append a job id (a local run's with its controller's start time); False if it was there."""
        if pid_start is not None:
            self.pid_starts = {**self.pid_starts, job_id: pid_start}
        if job_id in self.job_ids:
            return False
        self.job_ids = [*self.job_ids, job_id]
        return True


M = TypeVar("M", bound=BaseModel)
_MAX_DROPS = 64


def readable(model: type[M], data: JsonObject) -> tuple[M | None, JsonObject]:
    """`data` (a spec, profile or resources another slurmkit version wrote) as this version reads it,
    and what it had to leave out: each key it does not know, or whose value it now refuses, is moved
    out so its default applies. None when even that leaves no valid model (a required field refused)."""
    data = copy.deepcopy(data)
    dropped: JsonObject = {}
    for _ in range(_MAX_DROPS):
        try:
            return model.model_validate(data), dropped
        except ValidationError as exc:
            paths = {_key_path(e["loc"]) for e in exc.errors() if e["type"] != "missing"}
            if () in paths or not paths:
                break
            for path in paths:
                _move(data, path, dropped)
    return None, {**dropped, **data}


def _key_path(loc: tuple[int | str, ...]) -> tuple[str, ...]:
    """The error's location up to its first list index: a list is dropped whole, not item by item."""
    keys: list[str] = []
    for part in loc:
        if not isinstance(part, str):
            break
        keys.append(part)
    return tuple(keys)


def _move(data: JsonObject, path: tuple[str, ...], into: JsonObject) -> None:
    *parents, last = path
    for key in parents:
        if not isinstance(data.get(key), dict):
            return
        data, into = data[key], into.setdefault(key, {})
    if last in data:
        into[last] = data.pop(last)


class RunFile(LockedJson[RunRecord]):
    """run.json in a run folder."""

    model = RunRecord
    missing_error = "run has no run.json"

    def __init__(self, paths: RunPaths) -> None:
        super().__init__(paths.record)
        self.paths = paths

    def add_job_id(self, job_id: str, pid_start: int | None = None, **also: object) -> RunRecord:
        """Append a job id; a local run's is the controller's pid, kept with its start time (procs).
        `also`: more fields set in the same write."""
        with self.editing() as record:
            assign(record, also)
            record.add_job_id(job_id, pid_start)
        return record
