"""Finding a run from what a user types: a run id, a unique prefix, a folder, or a raw Slurm job id;
and listing the caller's runs and sweeps under run_root.

Listing trusts only what the caller owns: folders of other users under a shared run_root are
skipped (and counted), and a record's own folder is where it was found, whatever it says. An id is
looked up under run_root only; a path (it holds a `/`) gets the same rules, and no one else may be
able to swap it (slurmkit.common.trust).

A job id (`123`, or `123_4` for an array task) is what squeue, sacct and the Slurm mail show, so
every command that takes a run takes one too: the plain run whose record holds it, else the
sweep task that array task ran.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from slurmkit.common import trust
from slurmkit.errors import ConfigError, RunNotFoundError, did_you_mean, warn
from slurmkit.runs import RUN_FILE, CorruptRecordError, RunPaths, RunRecord, expand_root


def find(run_root: str, ident: str) -> RunPaths:
    """The run `ident` names; a job id is looked up only when no run id matches it."""
    try:
        return find_run(run_root, ident)
    except RunNotFoundError:
        m = trust.JOB_ID_RE.match(ident)
        found = _by_job_id(run_root, ident, m.group(1), m.group(2)) if m else None
        if found is None:
            raise
        return found


def _by_job_id(run_root: str, job_id: str, base: str, task: str | None) -> RunPaths | None:
    for paths in list_runs(run_root):
        try:
            if job_id in (RunRecord(paths).read().get("job_ids") or []):
                return paths
        except (RunNotFoundError, CorruptRecordError):  # skipped here; `list` reports it
            continue
    if task is None:
        return None
    from slurmkit.sweeps.store import ArrayLog, list_sweeps

    for sweep in list_sweeps(run_root):
        for arr in ArrayLog(sweep).read()["arrays"]:
            index = arr["base"] + int(task)
            if arr.get("job_id") == base and index in arr["indices"]:
                if not sweep.task(index).record.exists():
                    raise RunNotFoundError(f"job {job_id} is task {index} of sweep {sweep.sweep_id}, which has not "
                                           "started yet", where=str(sweep.sweep_dir),
                                           valid=f"see `slurmkit sweep status {sweep.sweep_id}`")
                return sweep.task(index)
    return None


_ID_STAMP_RE = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]{4}$")


def _newest_first_key(name: str, record_mtime_ns: int) -> tuple[str, str]:
    """When the run was created, from its id (run.json's mtime changes with every update, so
    listing by it reorders runs as they are written); then the name, so the order is stable."""
    m = _ID_STAMP_RE.search(name)
    stamp = m.group(1) if m else dt.datetime.fromtimestamp(record_mtime_ns / 1e9).strftime("%Y%m%d-%H%M%S")
    return stamp, name


def folders_with(run_root: str, marker: str) -> tuple[list[Path], int]:
    """The caller's folders under the root that hold `marker` (run.json, sweep.json), newest first,
    and how many folders of other users were skipped."""
    root = expand_root(run_root)
    if not root.is_dir():
        return [], 0
    found: list[tuple[tuple[str, str], str]] = []
    foreign = 0
    try:
        with os.scandir(root) as entries:  # strings, not Paths: 10,000 runs are listed on every `status`
            for entry in entries:
                try:
                    folder, record = entry.stat(follow_symlinks=False), os.lstat(os.path.join(entry.path, marker))
                except OSError:
                    continue
                if not stat.S_ISDIR(folder.st_mode) or not stat.S_ISREG(record.st_mode):
                    continue  # a symlinked folder or record could point anywhere
                if not _own(folder, record):
                    foreign += 1
                    continue
                found.append((_newest_first_key(entry.name, record.st_mtime_ns), entry.path))
    except OSError as exc:  # another user's private folder, a stale mount
        raise ConfigError(f"cannot list the run root: {exc.strerror or exc}", where=f"profile:run_root={root}",
                          valid="valid: a folder you can read; set run_root in your profile") from exc
    return [Path(d) for _, d in sorted(found, reverse=True)], foreign


def _own(folder: os.stat_result, record: os.stat_result) -> bool:
    """A run or sweep folder and its record that only the caller (or root) could have written."""
    return folder.st_uid == os.getuid() and record.st_uid == os.getuid() and not (
        (folder.st_mode | record.st_mode) & trust.WRITABLE_BY_OTHERS)


def by_path(ident: str, marker: str, what: str) -> Path:
    """The folder a path (one holding a `/`) names, held to the rules a listing applies (the folder
    and its record the caller's, no symlink, writable by no one else), and no one else able to swap
    it: every folder above it writable by others only with the sticky bit."""
    given = Path(os.path.expanduser(ident))
    folder = Path(os.path.realpath(given.parent)) / given.name
    valid = f"valid: a {what} folder of your own, in folders no one else can swap it in"
    try:
        st, record = os.lstat(folder), os.lstat(folder / marker)
    except OSError as exc:
        raise RunNotFoundError(f"no {what} folder at {ident}: {exc.strerror}", where=str(folder),
                               valid=f"valid: a folder holding {marker}") from exc
    if not stat.S_ISDIR(st.st_mode) or not stat.S_ISREG(record.st_mode) or not _own(st, record):
        why = trust.stat_reason(st, folder) or trust.stat_reason(record, folder / marker)
        raise trust.NotOwnError(why or f"{folder} is not the caller's {what} folder", where=str(folder), valid=valid)
    trust.check(trust.chain_reason(folder.parent), str(folder), valid)
    return folder


def find_folder(run_root: str, ident: str, marker: str, what: str) -> Path:
    """A run or sweep folder by id or unique id prefix, under run_root only; or by a path, which holds
    a `/` (`./ID` for one in the working folder): an id is never looked up where it was typed."""
    if "/" in ident:
        return by_path(ident, marker, what)
    folders, _ = folders_with(run_root, marker)
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
                                 f"a unique prefix, or its folder's path (with a /)")


def owned_folders(run_root: str, marker: str, what: str) -> list[Path]:
    """folders_with(), saying on stderr how many folders of other users were skipped."""
    folders, foreign = folders_with(run_root, marker)
    if foreign:
        warn(f"skipped {foreign} {what} folder(s) under {expand_root(run_root)} owned by other users")
    return folders


def list_runs(run_root: str) -> list[RunPaths]:
    """The caller's runs under the root, newest first; other users' folders are skipped, with a count on stderr."""
    return [RunPaths(d) for d in owned_folders(run_root, RUN_FILE, "run")]


T = TypeVar("T")


def readable(items: list[T], read: Callable[[T], dict[str, Any]]) -> list[tuple[T, dict[str, Any]]]:
    """Each item with what `read` gives; an unreadable record is skipped with one warning line naming it."""
    out = []
    for item in items:
        try:
            out.append((item, read(item)))
        except (CorruptRecordError, RunNotFoundError) as exc:
            warn(f"skipped {exc.one_line()}")
    return out


def read_records(runs: list[RunPaths]) -> list[tuple[RunPaths, dict[str, Any]]]:
    """Each run with its run.json; a corrupt one is skipped with one warning line naming it."""
    return readable(runs, lambda p: RunRecord(p).read())


def find_run(run_root: str, run: str) -> RunPaths:
    """A run by id, unique id prefix, or path of its folder."""
    return RunPaths(find_folder(run_root, run, RUN_FILE, "run"))
