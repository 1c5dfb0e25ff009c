"""JSON records read and written under a file lock: run.json (RunRecord) and its kin, and the
typed entry of run.json's restarts (RestartEntry).

The one writer of run.json: every change goes through RunRecord's update or editing, under its lock.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from slurmkit.common import perms, trust
from slurmkit.common.atomic import atomic_write_text
from slurmkit.common.errors import RunNotFoundError, SlurmkitError, clip
from slurmkit.common.layout import RunPaths

MAX_RECORD_BYTES = 64 << 20  # a record holds a script and restarts: far below this; a larger file is not one
MAX_TASKS = 1_000_000


class RestartEntry(BaseModel):
    """One entry of run.json's `restarts`: what started an incarnation or an in-job step, why, and
    what it cost. Every writer builds one of these; `record()` is its form in run.json."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["requeue", "in_job", "warm", "resubmit"]
    """requeue: Slurm requeued the job (incarnation `n`); in_job: a new srun step in the allocation;
    warm: the ranks restarted in their processes; resubmit: `slurmkit resubmit` (a new job id)."""
    n: int
    """The incarnation (SLURM_RESTART_COUNT) it started, or happened in."""
    job_id: str
    cause: str
    """crash, hang, node_failure, preemption, timeout, requeue, unknown, resubmit."""
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

    def record(self) -> dict[str, Any]:
        """The entry as run.json holds it: unset fields left out, `resumed_step` always present."""
        return {**self.model_dump(exclude_none=True), "resumed_step": self.resumed_step}


class LockedJson:
    """A JSON file read and updated under a file lock, so concurrent writers never lose an update."""

    missing_error = "no such file"
    indent: int | None = 1
    sort_keys = True

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: a lock file planted as a symlink must not create or open a file elsewhere.
        fd = os.open(self.path.parent / f".{self.path.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "r+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def read(self) -> dict[str, Any]:
        """The record, read from a file of the caller's own (checked on the open file), of at most
        MAX_RECORD_BYTES; a record of the wrong shape is a CorruptRecordError naming the field."""
        try:
            data = json.loads(trust.read_own(self.path, MAX_RECORD_BYTES))
        except FileNotFoundError as exc:
            raise RunNotFoundError(self.missing_error, where=str(self.path.parent)) from exc
        except (OSError, ValueError, trust.NotOwnError) as exc:  # ValueError: not JSON, or not UTF-8
            what = exc.what if isinstance(exc, trust.NotOwnError) else clip(str(exc))
            raise CorruptRecordError(f"unreadable: {what}", where=str(self.path),
                                     valid="valid: a JSON object; move the file away to drop the record") from exc
        if not isinstance(data, dict) or not data:
            raise CorruptRecordError(f"holds {clip(data)}, not a record", where=str(self.path),
                                     valid="valid: a JSON object; move the file away to drop the record")
        self.check_shape(data)
        return data

    def check_shape(self, data: dict[str, Any]) -> None:
        """Each field readers rely on has its type (none here; RunRecord has some)."""

    def _save(self, data: dict[str, Any]) -> None:
        text = json.dumps(data, indent=self.indent, sort_keys=self.sort_keys, default=str) + "\n"
        atomic_write_text(self.path, text, perms.file_mode(self.path.parent))

    def create(self, data: dict[str, Any]) -> bool:
        """Write `data` only if the file does not exist yet; False when someone else was first."""
        with self._locked():
            if self.path.exists():
                return False
            self._save(data)
            return True

    def update(self, **changes: Any) -> dict[str, Any]:
        with self._locked():
            data = self.read()
            data.update(changes)
            self._save(data)
            return data

    @contextmanager
    def editing(self) -> Iterator[dict[str, Any]]:
        """Read, let the caller change the mapping in place, write it back; all under the lock."""
        with self._locked():
            data = self.read()
            yield data
            self._save(data)


class CorruptRecordError(SlurmkitError):
    """A run.json or sweep.json that is not a JSON object."""


class RunRecord(LockedJson):
    """run.json: every job id the run ever had, its restarts and their causes."""

    missing_error = "run has no run.json"

    def __init__(self, paths: RunPaths) -> None:
        super().__init__(paths.record)
        self.paths = paths

    def check_shape(self, data: dict[str, Any]) -> None:
        """job_ids are Slurm job ids (or a local run's pids), num_tasks a count, restarts a list."""
        def bad(field: str, valid: str) -> CorruptRecordError:
            return CorruptRecordError(f"{field} is {clip(data[field])}", where=f"{self.path}:{field}",
                                      valid=f"valid: {valid}; move the file away to drop the record")

        ids = data.get("job_ids", [])
        if not isinstance(ids, list) or not all(isinstance(j, str) and trust.JOB_ID_RE.match(j) for j in ids):
            raise bad("job_ids", "a list of Slurm job ids such as \"123\" or \"123_4\"")
        tasks = data.get("num_tasks", 1)
        if type(tasks) is not int or not 1 <= tasks <= MAX_TASKS:
            raise bad("num_tasks", f"a whole number from 1 to {MAX_TASKS}")
        for field, kind in (("restarts", list), ("pid_starts", dict), ("preempted", dict), ("goodput", dict)):
            if data.get(field) is not None and not isinstance(data[field], kind):
                raise bad(field, f"a JSON {'list' if kind is list else 'object'}")

    def add_job_id(self, job_id: str, pid_start: int | None = None, **also: Any) -> dict[str, Any]:
        """Append a job id; a local run's is the controller's pid, kept with its start time (procs).
        `also`: more fields set in the same write."""
        with self.editing() as data:
            data.update(also)
            if job_id not in data.setdefault("job_ids", []):
                data["job_ids"].append(job_id)
            if pid_start is not None:
                data.setdefault("pid_starts", {})[job_id] = pid_start
        return data
