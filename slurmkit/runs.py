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
    def lock(self) -> Path:
        return self.run_dir / ".run.lock"

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

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def checkpoint_uri(self, checkpoint_root: str | None) -> str:
        """Where this run's checkpoints go: <checkpoint_root>/<run_id>, or the run folder's checkpoints/."""
        if checkpoint_root:
            return f"{os.path.expandvars(checkpoint_root).rstrip('/')}/{self.run_id}"
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


class RunRecord:
    """run.json, read and updated under a file lock so concurrent writers never lose a job id."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.paths.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.paths.lock, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def read(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.paths.record.read_text())
        except FileNotFoundError as exc:
            raise RunNotFoundError("run has no run.json", where=str(self.paths.run_dir)) from exc
        return data

    def _save(self, data: dict[str, Any]) -> None:
        atomic_write_text(self.paths.record, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")

    def write(self, data: dict[str, Any]) -> None:
        with self._locked():
            self._save(data)

    def update(self, **changes: Any) -> dict[str, Any]:
        with self._locked():
            data = self.read()
            data.update(changes)
            self._save(data)
            return data

    def add_job_id(self, job_id: str) -> dict[str, Any]:
        with self._locked():
            data = self.read()
            if job_id not in data.setdefault("job_ids", []):
                data["job_ids"].append(job_id)
            self._save(data)
            return data


def list_runs(run_root: str) -> list[RunPaths]:
    """Runs under the root, newest first."""
    root = expand_root(run_root)
    if not root.is_dir():
        return []
    runs = [RunPaths(d) for d in root.iterdir() if (d / RUN_FILE).is_file()]
    return sorted(runs, key=lambda p: p.record.stat().st_mtime_ns, reverse=True)


def find_run(run_root: str, run: str) -> RunPaths:
    """A run by id, unique id prefix, or path of its folder."""
    direct = Path(run).expanduser()
    if (direct / RUN_FILE).is_file():
        return RunPaths(direct.resolve())
    runs = list_runs(run_root)
    exact = [r for r in runs if r.run_id == run]
    matches = exact or [r for r in runs if r.run_id.startswith(run)]
    if len(matches) == 1:
        return matches[0]
    ids = [r.run_id for r in runs]
    if matches:
        raise RunNotFoundError(f"run '{run}' is ambiguous", where=str(expand_root(run_root)),
                               valid=f"matches: {', '.join(r.run_id for r in matches[:5])}")
    raise RunNotFoundError(f"no run '{run}'{did_you_mean(run, ids)}", where=str(expand_root(run_root)),
                           valid="valid: a run id from `slurmkit list`, a unique prefix, or a run folder")
