"""The caller's run and sweep folders under run_root: listed, and found by id, unique prefix or path.

Listing trusts only what the caller owns: folders of other users under a shared run_root are
skipped (and counted), symlinked folders and records too, and a record's own folder is where it
was found, whatever it says. An id is looked up under run_root only, never in the working folder;
a path (it holds a `/`) gets the same rules, and no one else may be able to swap it
(slurmkit.trust). Runs (slurmkit.runs.lookup) and sweeps (list_sweeps, find_sweep) are found here.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import stat
from pathlib import Path

from slurmkit import trust
from slurmkit.common.layout import expand_root
from slurmkit.common.sweep_layout import MANIFEST, SweepPaths
from slurmkit.errors import ConfigError, RunNotFoundError, did_you_mean, warn

_ID_STAMP_RE = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]{4,}$")


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
                if not trust.own_entry(folder, record):
                    foreign += 1
                    continue
                found.append((_newest_first_key(entry.name, record.st_mtime_ns), entry.path))
    except OSError as exc:  # another user's private folder, a stale mount
        raise ConfigError(f"cannot list the run root: {exc.strerror or exc}", where=f"profile:run_root={root}",
                          valid="valid: a folder you can read; set run_root in your profile") from exc
    return [Path(d) for _, d in sorted(found, reverse=True)], foreign


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
    if not stat.S_ISDIR(st.st_mode) or not stat.S_ISREG(record.st_mode) or not trust.own_entry(st, record):
        why = trust.stat_reason(st, folder) or trust.stat_reason(record, folder / marker)
        raise trust.NotOwnError(why or f"{folder} is not the caller's {what} folder", where=str(folder), valid=valid)
    trust.check(trust.chain_reason(folder.parent), str(folder), valid)
    return folder


def find_folder(run_root: str, ident: str, marker: str, what: str) -> Path:
    """A run or sweep folder by id or unique id prefix, under run_root only; or by a path, which holds
    a `/` (`./ID` for one in the working folder): an id is never looked up where it was typed."""
    if not ident.strip():  # every id starts with "": it would name them all
        raise RunNotFoundError(f"an empty {what} id", where=str(expand_root(run_root)),
                               valid=f"valid: a {what} id from `slurmkit {'list' if what == 'run' else 'sweep list'}`"
                                     ", a unique prefix, or its folder's path (with a /)")
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


def list_sweeps(run_root: str) -> list[SweepPaths]:
    return [SweepPaths(d) for d in owned_folders(run_root, MANIFEST, "sweep")]


def find_sweep(run_root: str, sweep: str) -> SweepPaths:
    return SweepPaths(find_folder(run_root, sweep, MANIFEST, "sweep"))
