"""Who may read and write a run: folder modes and the umask of everything a submit creates. Whether
what slurmkit opens is the caller's own is slurmkit.trust's to say.

A run folder is 0700 (private), or 0750 with setgid under a profile's `run_mode: group`, so a
team shares one group and can read, never write. The folder's own mode is the one record of
which it is: files in it are 0600, or 0640 in a group folder. Submitting sets the umask to match
(0077 or 0027), so submitit's pickles, sbatch's job (Slurm passes the submitter's umask on as
SLURM_UMASK) and with it logs, outcomes and checkpoints are never world-readable.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PRIVATE, GROUP = "private", "group"
FOLDER_MODE = {PRIVATE: 0o700, GROUP: 0o2750}
FILE_MODE = {PRIVATE: 0o600, GROUP: 0o640}
UMASK = {PRIVATE: 0o077, GROUP: 0o027}


def folder_kind(folder: Path) -> str:
    """group when the folder was made for group access (setgid), else private."""
    try:
        return GROUP if folder.stat().st_mode & stat.S_ISGID else PRIVATE
    except OSError:
        return PRIVATE


def file_mode(folder: Path) -> int:
    """The mode of files written in `folder`: 0600, or 0640 in a group folder."""
    return FILE_MODE[folder_kind(folder)]


def make_run_folder(folder: Path, run_mode: str = PRIVATE) -> None:
    """Create `folder` (not its parents) with the mode of run_mode, whatever the umask."""
    folder.mkdir(mode=0o700)
    os.chmod(folder, FOLDER_MODE[run_mode])


@contextmanager
def umask(run_mode: str = PRIVATE) -> Iterator[None]:
    """Everything created inside (submitit's folder and pickles, the job sbatch starts) gets run_mode's umask."""
    previous = os.umask(UMASK[run_mode])
    try:
        yield
    finally:
        os.umask(previous)
