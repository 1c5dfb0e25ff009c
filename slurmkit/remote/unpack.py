"""What a laptop sends along with a command (its spec files, its code, a pickled function), unpacked
into the login host's private stage: the one extraction, the same on every Python slurmkit supports.

tarfile's `filter="data"` came with Python 3.11.4; Debian 12's own python3 is 3.11.2. So the
guarantees are slurmkit's own, member by member, never the interpreter's:
- every name is relative, without `..`, and nothing is written through a link (no parent of a
  member is a symlink);
- a symlink stays inside the stage: relative, its target inside as written, and, once every member
  is in place, as the kernel resolves it (a link through another link cannot lead out); a hard link
  names a file unpacked before it;
- only files, folders and links: no devices, FIFOs or sockets;
- files are 0600 (0700 where executable) whatever the member says: no setuid, setgid or sticky
  bits, nothing for the group or others;
- at most `limit_bytes` of file data and MAX_MEMBERS members.
A member that breaks one is one UnpackError naming it and why.
"""

from __future__ import annotations

import os
import posixpath
import stat
import tarfile
from pathlib import Path, PurePosixPath
from typing import IO

from slurmkit.errors import SlurmkitError

MAX_MEMBERS = 200_000
CHUNK = 1 << 20


class UnpackError(SlurmkitError):
    """A member of what the laptop sent breaks one of the stage's rules (`member`: its name)."""

    def __init__(self, message: str, member: str = "") -> None:
        self.member = member
        super().__init__(message, where="the files sent along",
                         valid="valid: regular files, folders and links inside the code sent along "
                               "(git-ignore the others, or snapshot: false)")


def _refuse(member: tarfile.TarInfo, why: str) -> UnpackError:
    return UnpackError(f"{member.name!r} {why}", member.name)


def _relative(member: tarfile.TarInfo, name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not path.parts or path.is_absolute() or ".." in path.parts or "\0" in name:
        raise _refuse(member, "is not a relative name inside the stage")
    return path


def _inside(stage: Path, member: tarfile.TarInfo, rel: PurePosixPath) -> Path:
    """The member's path in the stage, its parents made as folders, none of them a link."""
    folder = stage
    for part in rel.parts[:-1]:
        folder = folder / part
        try:
            st = os.lstat(folder)
        except FileNotFoundError:
            folder.mkdir(mode=0o700)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(member, f"goes through {part!r}, which is not a folder")
    return folder / rel.parts[-1]


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    source = tar.extractfile(member)
    assert source is not None
    mode = 0o700 if member.mode & 0o100 else 0o600
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as out:
        while chunk := source.read(CHUNK):
            out.write(chunk)


def extract(stream: IO[bytes], stage: Path, limit_bytes: int) -> None:
    """Unpack the tar `stream` into `stage` (a fresh, private folder), member by member, or refuse."""
    total = 0
    files: set[PurePosixPath] = set()
    links: list[tuple[tarfile.TarInfo, Path]] = []
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for n, member in enumerate(tar):
                if n >= MAX_MEMBERS:
                    raise _refuse(member, f"is past the limit of {MAX_MEMBERS} files")
                rel = _relative(member, member.name)
                target = _inside(stage, member, rel)
                if member.isdir():
                    if not target.is_dir():
                        target.mkdir(mode=0o700)
                elif member.isreg():
                    total += member.size
                    if total > limit_bytes:
                        raise _refuse(member, f"takes what was sent past {limit_bytes >> 20} MiB")
                    _write(tar, member, target)
                    files.add(rel)
                elif member.issym():
                    if member.linkname.startswith("/"):
                        raise _refuse(member, f"is a symlink to the absolute path {member.linkname!r}")
                    resolved = posixpath.normpath(posixpath.join(str(rel.parent), member.linkname))
                    if resolved == ".." or resolved.startswith("../"):
                        raise _refuse(member, f"is a symlink out of the code sent along ({member.linkname!r})")
                    os.symlink(member.linkname, target)
                    links.append((member, target))
                elif member.islnk():
                    source = _relative(member, member.linkname)
                    if source not in files:
                        raise _refuse(member, f"is a hard link to {member.linkname!r}, not a file sent before it")
                    os.link(stage / source, target, follow_symlinks=False)
                else:
                    raise _refuse(member, "is a device, FIFO or socket")
    except tarfile.TarError as exc:
        raise UnpackError(f"not a tar stream: {exc}") from None
    except FileExistsError as exc:
        raise UnpackError(f"{exc.filename} was sent twice", str(exc.filename)) from None
    root = os.path.realpath(stage)
    for member, link in links:
        if os.path.commonpath([root, os.path.realpath(link)]) != root:
            raise _refuse(member, f"is a symlink that leads out of the code sent along ({member.linkname!r})")
