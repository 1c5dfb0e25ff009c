"""Run folders and the run registry: RunPaths is the only code that builds run-folder paths.

A run folder holds run.json (the record), the rendered script, submitit's job folder, metrics
and checkpoints. The run id stays the same across requeues and resubmits; every Slurm job id
the run ever had is appended to run.json.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmkit.errors import RunNotFoundError, did_you_mean

RUN_FILE = "run.json"


def expand_root(run_root: str) -> Path:
    return Path(os.path.expandvars(run_root)).expanduser()


def new_run_id(name: str) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temp file in the same folder, fsync, rename, fsync the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@dataclass(frozen=True)
class RunPaths:
    """Every path of one run."""

    run_dir: Path

    @classmethod
    def create(cls, run_root: str, name: str) -> RunPaths:
        root = expand_root(run_root)
        while True:
            paths = cls(root / new_run_id(name))
            try:
                paths.run_dir.mkdir(parents=True)
                return paths
            except FileExistsError:
                continue

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
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def checkpoint_uri(self, checkpoint_root: str | None, key: str | None = None) -> str:
        """Where this run's checkpoints go: <checkpoint_root>/<key or run_id>, or the run folder's checkpoints/."""
        if checkpoint_root:
            return f"{os.path.expandvars(checkpoint_root).rstrip('/')}/{key or self.run_id}"
        return str(self.checkpoints)

    @property
    def restart_request(self) -> Path:
        """Why the running job asked to be requeued; read and removed by the next incarnation."""
        return self.run_dir / "restart-request.json"

    def hang_marker(self, rank: int) -> Path:
        return self.run_dir / f"hang-rank{rank}.json"

    def result_pickle(self, job_id: str, rank: int) -> Path:
        """submitit's per-rank result: ("success", value) or ("error", traceback)."""
        return self.job_folder / f"{job_id}_{rank}_result.pkl"

    def outcome(self, job_id: str, rank: int) -> tuple[str, Any] | None:
        """A rank's (outcome, value), or None when it wrote none or it cannot be read."""
        from submitit.core.utils import pickle_load

        try:
            outcome, value = pickle_load(self.result_pickle(job_id, rank))
        except Exception:
            return None
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

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.parent / f".{self.path.name}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def read(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.path.read_text())
        except FileNotFoundError as exc:
            raise RunNotFoundError(self.missing_error, where=str(self.path.parent)) from exc
        return data

    def _save(self, data: dict[str, Any]) -> None:
        atomic_write_text(self.path, json.dumps(data, indent=self.indent, sort_keys=True, default=str) + "\n")

    def write(self, data: dict[str, Any]) -> None:
        with self._locked():
            self._save(data)

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


class RunRecord(LockedJson):
    """run.json: every job id the run ever had, its restarts and their causes."""

    missing_error = "run has no run.json"

    def __init__(self, paths: RunPaths) -> None:
        super().__init__(paths.record)
        self.paths = paths

    def add_job_id(self, job_id: str) -> dict[str, Any]:
        with self.editing() as data:
            if job_id not in data.setdefault("job_ids", []):
                data["job_ids"].append(job_id)
        return data


def folders_with(run_root: str, marker: str) -> list[Path]:
    """Folders under the root that hold `marker` (run.json, sweep.json), newest first."""
    root = expand_root(run_root)
    if not root.is_dir():
        return []
    found = [d for d in root.iterdir() if (d / marker).is_file()]
    return sorted(found, key=lambda d: (d / marker).stat().st_mtime_ns, reverse=True)


def find_folder(run_root: str, ident: str, marker: str, what: str) -> Path:
    """A run or sweep folder by id, unique id prefix, or path."""
    direct = Path(ident).expanduser()
    if (direct / marker).is_file():
        return direct.resolve()
    folders = folders_with(run_root, marker)
    exact = [f for f in folders if f.name == ident]
    matches = exact or [f for f in folders if f.name.startswith(ident)]
    if len(matches) == 1:
        return matches[0]
    where = str(expand_root(run_root))
    if matches:
        raise RunNotFoundError(f"{what} '{ident}' is ambiguous", where=where,
                               valid=f"matches: {', '.join(f.name for f in matches[:5])}")
    ids = [f.name for f in folders]
    raise RunNotFoundError(f"no {what} '{ident}'{did_you_mean(ident, ids)}", where=where,
                           valid=f"valid: a {what} id from `slurmkit {'list' if what == 'run' else 'sweep list'}`, "
                                 f"a unique prefix, or its folder")


def list_runs(run_root: str) -> list[RunPaths]:
    """Runs under the root, newest first."""
    return [RunPaths(d) for d in folders_with(run_root, RUN_FILE)]


def find_run(run_root: str, run: str) -> RunPaths:
    """A run by id, unique id prefix, or path of its folder."""
    return RunPaths(find_folder(run_root, run, RUN_FILE, "run"))
