"""The one atomic write protocol: a reader sees the old file or the new one, never half of either.

Write a temp file in the same folder (O_EXCL), in 1 MiB chunks, fsync it, rename it over the
target, fsync the folder. Used for run.json and sweep.json, outcome records, scripts, and every
file of a checkpoint on a local or parallel filesystem. A run's sbatch.sh, a copy of run.json's
"script", skips the fsyncs (durable=False): it is still all or nothing to a reader.
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

from slurmkit.common import perms
from slurmkit.errors import SlurmkitError

WRITE_CHUNK = 1 << 20  # 1 MiB writes, as dd bs=1M: one huge write() was 3x slower here
PRIVATE_FILE = 0o600


def atomic_write(path: Path | str, data: bytes, mode: int = PRIVATE_FILE, durable: bool = True) -> None:
    """Replace `path` with `data`; the file is created with `mode`, narrowed by the umask.
    durable=False skips both fsyncs (still all or nothing to a reader): for a copy of what a
    durable file already holds, such as a run's sbatch.sh beside run.json's "script"."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            view = memoryview(data)
            for start in range(0, len(view), WRITE_CHUNK):
                chunk = view[start:start + WRITE_CHUNK]
                while chunk:
                    chunk = chunk[os.write(fd, chunk):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_text(path: Path | str, text: str, mode: int = PRIVATE_FILE, durable: bool = True) -> None:
    atomic_write(path, text.encode(), mode, durable)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def write_output(path: Path, data: bytes) -> None:
    """A file the user named (`report -o`, on the login host or fetched to a laptop): written beside
    and renamed over, so a symlink planted at its name is replaced, never followed; 0600, or 0640 in
    a group run folder; a path that cannot be written is one SlurmkitError, and so is a device, a
    FIFO or a socket at its name (`/dev/null`: renamed over, it would be replaced for everyone)."""
    try:
        if (st := _lstat(path)) is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise SlurmkitError("not a regular file (a device, a FIFO or a socket)", where=str(path),
                                valid="valid: a file path in a folder you can write")
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data, perms.file_mode(path.parent), durable=False)
    except OSError as exc:
        raise SlurmkitError(f"cannot write there: {exc.strerror or exc}", where=str(path),
                            valid="valid: a file in a folder you can write") from None
