"""Run folders and the run registry: RunPaths is the only code that builds run-folder paths.

A run folder holds run.json (the record), the rendered script, submitit's job folder, each
rank's outcome, metrics and checkpoints. The run id stays the same across requeues and
resubmits; every Slurm job id the run ever had is appended to run.json. run.json changes only
through LockedJson's locked editor (update, editing, create), so no update is ever lost.
Finding and listing runs is slurmkit.lookup's.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmkit import perms
from slurmkit.common import outcomes, trust
from slurmkit.common.atomic import atomic_write_text
from slurmkit.common.outcomes import Outcome
from slurmkit.errors import ConfigError, RunNotFoundError, SlurmkitError, clip

RUN_FILE = "run.json"
CREATE_ATTEMPTS = 20
MAX_RECORD_BYTES = 64 << 20  # a record holds a script and restarts: far below this; a larger file is not one
MAX_TASKS = 1_000_000
"""The most ranks a run record may claim (a larger num_tasks is not a record slurmkit wrote)."""


_VAR_RE = re.compile(r"\$(\w+|\{[^}]*\})")


def expand_vars(value: str, field: str) -> str:
    """$VARS of the login node's environment expanded; one left unset is an error naming it. A
    literal `$USER` folder (what os.path.expandvars leaves) is never what the user meant."""
    expanded = os.path.expandvars(value)
    unset = _VAR_RE.search(expanded)
    if unset:
        raise ConfigError(f"{unset.group(0)} is not set in this environment", where=f"profile:{field}={clip(value)}",
                          valid="valid: set it before running slurmkit, or write the path out")
    return expanded


def expand_root(run_root: str) -> Path:
    """The run root as an absolute path (~ and $VARS expanded on the login node)."""
    root = Path(os.path.expanduser(expand_vars(run_root, "run_root")))
    if not root.is_absolute():
        raise ConfigError("run_root is a relative path: it would depend on the folder slurmkit runs in",
                          where=f"profile:run_root={clip(run_root)}",
                          valid="valid: an absolute path, ~/... or $VAR/...")
    return root


def expand_checkpoint_root(checkpoint_root: str) -> str:
    """checkpoint_root with $VARS expanded (a path or an fsspec URL), without a trailing /."""
    return expand_vars(checkpoint_root, "checkpoint_root").rstrip("/")


def check_checkpoint_root(checkpoint_root: str | None) -> None:
    """A checkpoint_root on a filesystem path must not let another user swap a run's checkpoint
    folder: the folders down to it (its nearest existing one) writable by others only with the
    sticky bit. An object store's bucket policy is the store's to enforce (docs/security.md)."""
    if not checkpoint_root or ("://" in checkpoint_root and not checkpoint_root.startswith("file://")):
        return
    path = Path(os.path.expanduser(expand_checkpoint_root(checkpoint_root).removeprefix("file://")))
    existing = next((p for p in [path, *path.parents] if p.exists()), Path("/"))
    if why := trust.chain_reason(existing):
        raise ConfigError(why, where=f"profile:checkpoint_root={clip(checkpoint_root)}",
                          valid="valid: a folder of your own, or a shared one with the sticky bit (as /tmp)")


def new_run_id(name: str) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(2)}"



@dataclass(frozen=True)
class RunPaths:
    """Every path of one run."""

    run_dir: Path

    @classmethod
    def create(cls, run_root: str, name: str, run_mode: str = perms.PRIVATE,
               checkpoint_root: str | None = None) -> RunPaths:
        """A new, empty run folder (0700, or 0750+setgid for run_mode group); one clear error if it cannot be.
        A local checkpoint_root others could swap a run's checkpoints in is refused here too."""
        check_checkpoint_root(checkpoint_root)
        root = expand_root(run_root)
        where = f"profile:run_root={clip(run_root)}"
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            # A dangling symlink or a file in the way reads as FileExistsError: say what is there.
            what = "a dangling symlink" if root.is_symlink() and not root.exists() else exc.strerror or str(exc)
            raise ConfigError(f"cannot create the run root: {what}", where=where,
                              valid="valid: a writable folder on a filesystem shared with the compute nodes") from exc
        if not root.is_dir():
            raise ConfigError("the run root is not a folder", where=where, valid="valid: a writable folder")
        if reason := trust.chain_reason(root):
            raise ConfigError(reason, where=where, valid="valid: a folder of your own, in folders only you or root "
                                                         "can write, or shared ones with the sticky bit (as /tmp)")
        for _ in range(CREATE_ATTEMPTS):  # a clash on the random id is rare; never spin forever
            paths = cls(root / new_run_id(name))
            try:
                perms.make_run_folder(paths.run_dir, run_mode)
                return paths
            except FileExistsError:
                continue
            except OSError as exc:
                raise ConfigError(f"cannot create a run folder: {exc.strerror or exc}", where=where,
                                  valid="valid: a writable folder with free space") from exc
        raise SlurmkitError(f"no free run id after {CREATE_ATTEMPTS} attempts", where=where)

    @contextmanager
    def or_nothing(self) -> Iterator[None]:
        """The first writes into a new folder: on any failure the folder goes, and an OSError (full disk,
        read-only, quota) becomes one ConfigError, so a failed submit leaves nothing behind."""
        try:
            yield
        except BaseException as exc:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            if isinstance(exc, OSError):
                raise ConfigError(f"cannot write {clip(exc.filename or str(self.run_dir))}: {exc.strerror or exc}",
                                  where="profile:run_root", valid="valid: a writable run_root with free space") from exc
            raise

    def write_script(self, text: str) -> None:
        # Not fsynced: run.json, written durably just before, holds the same text as "script".
        atomic_write_text(self.script, text, perms.file_mode(self.run_dir), durable=False)

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    @property
    def record(self) -> Path:
        return self.run_dir / RUN_FILE

    @property
    def script(self) -> Path:
        return self.run_dir / "sbatch.sh"

    @property
    def job_folder(self) -> Path:
        """submitit's folder: pickles, results and per-rank logs."""
        return self.run_dir / "submitit"

    @property
    def metrics(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    def gpu_metrics(self, host: str) -> Path:
        """GPU samples of one node (each node's first rank writes its own file)."""
        return self.run_dir / f"metrics-gpu-{host}.jsonl"

    @property
    def code_dir(self) -> Path:
        """The code snapshot every incarnation runs from (profile or spec `snapshot: true`)."""
        return self.run_dir / "code"

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def checkpoint_uri(self, checkpoint_root: str | None, key: str | None = None) -> str:
        """Where this run's checkpoints go: <checkpoint_root>/<key or run_id>, or the run folder's checkpoints/."""
        if checkpoint_root:
            return f"{expand_checkpoint_root(checkpoint_root)}/{key or self.run_id}"
        return str(self.checkpoints)

    @property
    def restart_request(self) -> Path:
        """Why the running job asked to be requeued; read and removed by the next incarnation."""
        return self.run_dir / "restart-request.json"

    @property
    def stop_marker(self) -> Path:
        """The step the ranks agreed to stop at, written before its save: if the save never ends
        (killed after GraceTime) the next incarnation still knows how far the last one got."""
        return self.run_dir / "stopping.json"

    @property
    def supervisor_events(self) -> Path:
        """The job's supervisor's states and decisions, one JSON line each (slurmkit.worker.supervisor)."""
        return self.run_dir / "supervisor.jsonl"

    def hang_marker(self, rank: int) -> Path:
        return self.run_dir / f"hang-rank{rank}.json"

    def hang_markers(self) -> list[Path]:
        """Every rank's hang marker present, by rank."""
        return sorted(self.run_dir.glob("hang-rank*.json"))

    def standby_go(self, job_id: str, restart_count: int, attempt: int) -> Path:
        """The requeue policy hands in-job attempt `attempt` of incarnation `restart_count` of the job
        to its standby ranks (slurmkit.worker.standby): a later incarnation, or a resubmitted job,
        has standby ranks of its own."""
        return self.run_dir / f"standby-go-{job_id}.{restart_count}.{attempt}"

    def injected_marker(self, step: int) -> Path:
        """A one-shot fault injected at `step` has fired (config.inject_transient_error_at_steps)."""
        return self.run_dir / f"injected-step{step}"

    def health_marker(self, node: str) -> Path:
        """Why `node` failed the health gate (written by the gate, read by the requeue)."""
        return self.run_dir / f"health-{node}.json"

    def health_markers(self) -> list[Path]:
        return sorted(self.run_dir.glob("health-*.json"))

    @property
    def report(self) -> Path:
        """Where `slurmkit report` draws the run unless told otherwise."""
        return self.run_dir / "report.png"

    def result_pickle(self, job_id: str, rank: int) -> Path:
        """submitit's per-rank result: ("success", value) or ("error", traceback). Read only by `result`."""
        return self.job_folder / f"{job_id}_{rank}_result.pkl"

    def outcome_file(self, job_id: str, rank: int) -> Path:
        """A rank's outcome as JSON (slurmkit.common.outcomes), written when the rank finishes."""
        return self.run_dir / "outcomes" / f"{job_id}_{rank}.json"

    def outcome_ranks(self, job_id: str) -> list[int]:
        """The ranks of job `job_id` that wrote an outcome record, in order."""
        try:
            names = os.listdir(self.run_dir / "outcomes")
        except OSError:
            return []
        prefix = f"{job_id}_"
        return sorted(int(n[len(prefix):-5]) for n in names
                      if n.startswith(prefix) and n.endswith(".json") and n[len(prefix):-5].isdigit())

    def outcome(self, job_id: str, rank: int) -> Outcome | None:
        """A rank's outcome, or None when it wrote none (still running, requeued, killed)."""
        return outcomes.read(self.outcome_file(job_id, rank))

    def unpickle_result(self, job_id: str, rank: int) -> tuple[str, Any]:
        """submitit's result pickle, only from a folder the caller owns and no one else can write,
        checked on the open file (one open: nothing can be swapped in between)."""
        # A sweep task's submitit/ is a link to the sweep's own: load_pickle follows links to the folders.
        outcome, value = trust.load_pickle(self.result_pickle(job_id, rank), "the result",
                                           (self.run_dir, self.job_folder))
        return str(outcome), value

    def rank_log(self, job_id: str, rank: int, stream: str = "out") -> Path:
        """submitit's per-rank log name (its JobPaths layout: JOBID_RANK_log.out)."""
        return self.job_folder / f"{job_id}_{rank}_log.{stream}"

    def rank_logs(self, job_id: str) -> dict[int, Path]:
        found: dict[int, Path] = {}
        for f in self.job_folder.glob(f"{job_id}_*_log.out"):
            rank = f.name[len(job_id) + 1 :].split("_", 1)[0]
            if rank.isdigit():
                found[int(rank)] = f
        return dict(sorted(found.items()))


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
