"""Whether a file, folder or id is the caller's own: the one module every such check goes through.

The threat (docs/security.md): another user with a shell on the login node and the compute nodes,
who can read world-readable files, write shared folders, list processes and connect to ports. So
what slurmkit acts on is checked when it is opened, on the open file (`fstat`, `O_NOFOLLOW`), never
by a `stat` of the path before a second open, and a refusal is one line (`NotOwnError`):

- a file or folder is trusted when it is the caller's (or root's), is no symlink, and no one else
  can write it (`reason`);
- a folder others could swap things in is trusted only when every folder from `/` down to it is
  writable by others only with the sticky bit, and owned by the caller or root (`chain_reason`);
- a file read as code or configuration (a profile and each file it extends, a run or sweep spec, a
  template, a venv's activate script) is opened that way too (`open_config`): another user's
  would run as the caller;
- a pickle is loaded only from a file opened that way (`load_pickle`), never by path twice;
- a Slurm job id is digits in the forms Slurm prints (`job_id`), so no id can reach a Slurm
  command as an option;
- the run's secret (`run_secret`) signs what the ranks exchange through their store and derives
  Ray's token (slurmkit.worker.signed_store, slurmkit.worker.ray_driver).

Torch-free and light: the login side, the supervisor and the ranks all import it, and so does
`config` (its YAML reader), which is why it is a top module and not part of `common/`.
"""

from __future__ import annotations

import errno
import os
import pickle
import pwd
import re
import secrets
import stat
from pathlib import Path
from typing import Any

from slurmkit.errors import SlurmkitError, clip

JOB_ID_RE = re.compile(r"^(\d+)(?:_(\d+))?$")
"""A job id (`123`), or an array task's (`123_4`): what slurmkit records and passes to Slurm."""
_STEP_RE = re.compile(r"^(\d+(?:_\d+)?)(?:\+\d+)?(?:\.(?:\d+|batch|extern|interactive))?$")


def job_of(ident: str) -> str:
    """The job id in a step or component id as sacct and squeue print them: `123.0`, `123.batch`,
    `123_4.extern`, `123+0` -> `123`, `123_4`; anything else unchanged."""
    m = _STEP_RE.match(ident)
    return m.group(1) if m else ident


WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


class NotOwnError(SlurmkitError):
    """A file, folder or id that is not the caller's own, or that another user could change."""


def _me() -> tuple[int, ...]:
    return (os.getuid(), 0)


def stat_reason(st: os.stat_result, path: Path | str) -> str | None:
    """Why what `st` describes could hold another user's writing; None when only the caller (or
    root) could have written it."""
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink: it could point anywhere"
    if st.st_uid not in _me():
        return f"{path} is owned by {owner(st.st_uid)}, not by you (uid {os.getuid()})"
    if st.st_mode & WRITABLE_BY_OTHERS:
        return f"{path} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'}"
    return None


def owner(uid: int) -> str:
    """`uid 1234 (alice)`: who owns a file, by number and, where the system knows it, by name."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def own_entry(folder: os.stat_result, record: os.stat_result) -> bool:
    """A run or sweep folder and its record are the caller's own (root's are not: a listing shows the
    caller's runs), and neither is writable by anyone else."""
    return folder.st_uid == record.st_uid == os.getuid() and not (
        (folder.st_mode | record.st_mode) & WRITABLE_BY_OTHERS)


def reason(path: Path | str, follow: bool = False) -> str | None:
    """stat_reason of `path` itself, or with follow of what it leads to (a symlink in the caller's own
    folder was put there by the caller); a path that cannot be read says why."""
    try:
        return stat_reason(os.stat(path) if follow else os.lstat(path), path)
    except OSError as exc:
        return f"cannot stat {path}: {exc.strerror}"


def swap_reason(st: os.stat_result, path: Path | str) -> str | None:
    """Why another user could rename entries of the folder `st` describes away and put their own in
    their place: writable by others without the sticky bit, or owned by someone else."""
    if st.st_uid not in _me():
        return f"{path} is owned by uid {st.st_uid}: its owner could swap what is in it"
    if st.st_mode & WRITABLE_BY_OTHERS and not st.st_mode & stat.S_ISVTX:
        who = "others" if st.st_mode & stat.S_IWOTH else "its group"
        return f"{path} is writable by {who} without the sticky bit: anyone there could swap what is in it"
    return None


def chain_reason(folder: Path | str) -> str | None:
    """swap_reason of `folder` and of every folder above it (symlinks followed, as the kernel does
    when it opens a path below); None when no other user can swap anything on the way."""
    path = Path(os.path.realpath(folder))
    for part in [path, *path.parents]:
        try:
            st = os.stat(part)
        except OSError as exc:
            return f"cannot stat {part}: {exc.strerror}"
        if why := swap_reason(st, part):
            return why
    return None


def private_folder(base: Path, env: str, holds: str) -> Path:
    """`base`, made 0700 where missing, refused in one line unless it is the caller's own, reachable by
    no one else, and no other user can swap a folder on the way: where slurmkit keeps `holds` (a
    connection's socket, a node ledger). `env` names the variable that moves it."""
    valid = f"valid: a folder of your own that only you can reach (set {env} to one)"
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:  # a folder on the way another user made (and keeps us out of), a read-only home
        check(reason(base.parent) or chain_reason(base.parent.parent) or f"cannot make {base}: {exc.strerror}",
              str(base), valid)
    mode = base.stat().st_mode & 0o777
    private = f"{base} has mode {mode:o}: others could reach {holds}" if mode & 0o077 else None
    check(reason(base) or private or chain_reason(base.parent), str(base), valid)
    return base


def check(why: str | None, where: str, valid: str) -> None:
    """Refuse in one line when there is a reason to."""
    if why:
        raise NotOwnError(why, where=where, valid=valid)


def open_own(path: Path | str, flags: int = os.O_RDONLY) -> int:
    """Open `path` (not following a final symlink) and check the open file, not the path: a file
    descriptor to a file only the caller or root could have written, else NotOwnError."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the final component is a symlink
            raise NotOwnError(f"{path} is a symlink: it could point anywhere", where=str(path),
                              valid="valid: a file of your own") from exc
        raise
    try:
        check(stat_reason(os.fstat(fd), path), str(path), "valid: a file you own that no one else can write")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_append(path: Path | str, mode: int = 0o666) -> int:
    """A file of a run folder opened to append (made if missing, `mode` narrowed by the umask), never
    through a symlink planted at its name."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def touch(path: Path | str) -> None:
    """A marker file of a run folder, made (or left) in place, never through a symlink."""
    os.close(open_append(path, 0o600))


CONFIG_VALID = ("valid: a file you (or root) own that no one else can write "
                "(`chmod go-w FILE`; a colleague's file: copy it into a folder of your own)")


def open_config(path: Path | str, flags: int = os.O_RDONLY) -> int:
    """open_own for a file read as code or configuration (a profile and each file it extends, a run
    or sweep spec, a template, a venv's activate script): another user's file, a file others can
    write, or a symlink at its name is refused in one line naming the file and its owner."""
    try:
        return open_own(path, flags)
    except NotOwnError as exc:
        raise NotOwnError(f"{exc.what}, and slurmkit reads it as code or configuration", where=str(path),
                          valid=CONFIG_VALID) from None


def read_own(path: Path | str, limit: int) -> bytes:
    """The bytes of a file of the caller's own, at most `limit` of them (a larger one is refused)."""
    with os.fdopen(open_own(path), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise NotOwnError(f"{path} is over {limit} bytes", where=str(path), valid="valid: a smaller file")
    return data


def load_pickle(path: Path | str, what: str, folders: tuple[Path, ...] = ()) -> Any:
    """Unpickle `path` only when the open file is the caller's (or root's) and no one else can write
    it, nor the `folders` it lies in."""
    try:
        for folder in folders:
            check(reason(folder, follow=True), str(folder), "")
        fd = open_own(path)
    except NotOwnError as exc:
        raise NotOwnError(f"refusing to unpickle {what}: {exc.what}", where=str(path),
                          valid="valid: a run folder you own that no one else can write; "
                                "its outcome (state, error, JSON value) is in outcomes/*.json") from exc
    with os.fdopen(fd, "rb") as f:
        return pickle.load(f)  # noqa: S301 - the open file was checked above


SECRET_FILE = "secret"
SECRET_BYTES = 32


def run_secret(folder: Path | str) -> bytes:
    """The run's secret: 32 random bytes in `folder` (the run folder, 0600 whatever the run_mode), made
    by whichever process asks first (written aside, then linked: never half a secret) and read by
    every rank: the ranks' store signs with it (slurmkit.worker.signed_store), Ray's token comes from it."""
    folder = Path(folder)
    check(reason(folder, follow=True), str(folder), "valid: a run folder of your own")
    path = folder / SECRET_FILE
    if not path.exists():
        tmp = folder / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, secrets.token_bytes(SECRET_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another rank was first: theirs is the secret
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    data = read_own(path, SECRET_BYTES)
    if len(data) != SECRET_BYTES:
        raise NotOwnError(f"{path} holds {len(data)} bytes, not a secret", where=str(path),
                          valid="valid: remove it; the next start makes a new one")
    return data


def job_id(value: object, where: str) -> str:
    """A Slurm job id as slurmkit records it, else NotOwnError: it never reaches a command as an option."""
    if isinstance(value, str) and JOB_ID_RE.match(value):
        return value
    raise NotOwnError(f"{clip(value)} is not a Slurm job id", where=where, valid="valid: 123 or 123_4")
